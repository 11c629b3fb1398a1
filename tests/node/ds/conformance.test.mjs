// The Durable Streams conformance suite from npm, against the server at CONFORMANCE_TEST_URL
// (baton's gateway or the reference server). Run by tests/durable_streams/test_conformance.py
// through vitest; results come back as vitest's JSON report.
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_TEST_URL
if (!baseUrl) throw new Error("CONFORMANCE_TEST_URL is required")
runConformanceTests({ baseUrl })
