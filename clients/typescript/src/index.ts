// TypeScript client of baton's gRPC run API (baton.v1.Runs) on @grpc/grpc-js: the twin of the
// Python baton/grpc_client.py. Messages and the service client are generated from
// protos/baton/v1/*.proto at build time (src/gen/, scripts/gen.mjs).
//
//   const runs = new BatonRunsClient("127.0.0.1:8081", { apiKey: "k1" });
//   for await (const chunk of runs.startRun({ runId, threadId, messages, agent: { kind: "replay", journal } })) {
//     console.log(chunk.offset, chunk.event().type);   // resumes on its own after a broken stream
//   }
//   for await (const chunk of runs.joinRun(runId, { afterOffset: "42" })) { ... }
//   await runs.cancelRun({ runId, wait: true });
//   await runs.keepRun(runId, 4 * 3600);   // keep it 4 h should nobody read it (clamped by the gateway)
//
// Every chunk is yielded exactly once, in order: when a stream breaks (UNAVAILABLE: the
// connection was lost, the gateway restarted, its log read failed) the stream joins again
// strictly after the last offset it yielded. Errors are BatonError: the gRPC code and the
// google.rpc.ErrorInfo reason and metadata (the same reasons as the HTTP API).
import * as grpc from "@grpc/grpc-js";

import {
  ActiveRunResponse, AgentListResponse, LogChunk, RunCancelRequest, RunCancelResponse, RunEvent, RunInfo,
  RunJoinRequest, RunKeepResponse, RunListResponse, RunMessagesPage, RunStartRequest, RunsClient as RunsStub, ThreadDeleteResponse,
  ThreadForkResponse, Transcript,
} from "./gen/baton/v1/runs_service";
import { ErrorInfo } from "./gen/google/rpc/error_details";
import { Status } from "./gen/google/rpc/status";

export * from "./gen/baton/v1/runs_service";
export { AgentSpec, RunError, RunStatus } from "./gen/baton/v1/runs";

const DETAILS_KEY = "grpc-status-details-bin";
// A broken stream is retried with these pauses (ms); the counter resets on progress.
const BACKOFF_MS = [50, 100, 200, 500, 1000, 2000];

/** An error of the API: its gRPC status code and its google.rpc.ErrorInfo (empty reason if none). */
export class BatonError extends Error {
  /** The gRPC status code (grpc.status.NOT_FOUND…). */
  readonly code: grpc.status;
  /** Its name ("NOT_FOUND"). */
  readonly codeName: string;
  /** ErrorInfo.reason: "UNKNOWN_RUN", "INVALID_ARGUMENT", "OFFSET_EXPIRED"… (the HTTP body's `reason`). */
  readonly reason: string;
  /** ErrorInfo.domain ("baton.dev"). */
  readonly domain: string;
  /** ErrorInfo.metadata: the error's data as strings (e.g. {run_id}). */
  readonly metadata: Record<string, string>;

  constructor(code: grpc.status, reason: string, message: string, metadata: Record<string, string> = {},
              domain = "baton.dev") {
    super(`${reason || grpc.status[code]}: ${message}`);
    this.name = "BatonError";
    this.code = code;
    this.codeName = grpc.status[code] ?? String(code);
    this.reason = reason;
    this.domain = domain;
    this.metadata = metadata;
  }

  /** The BatonError of a grpc-js error: the ErrorInfo from the status details trailer. */
  static fromServiceError(err: grpc.ServiceError): BatonError {
    let info: ErrorInfo | undefined;
    const raw = err.metadata?.get(DETAILS_KEY)?.[0];
    if (raw !== undefined && typeof raw !== "string") {
      try {
        const status = Status.decode(raw);
        const any = status.details.find((d) => d.typeUrl.endsWith("/google.rpc.ErrorInfo"));
        if (any) info = ErrorInfo.decode(any.value);
      } catch {
        info = undefined; // undecodable details: the code and message alone
      }
    }
    return new BatonError(err.code, info?.reason ?? "", err.details ?? err.message, { ...(info?.metadata ?? {}) },
                          info?.domain ?? "");
  }
}

/** One chunk of a run's log. */
export class Chunk {
  /** @param offset its position (resume after it). @param json the AG-UI event's JSON, byte-equal to SSE `data:`. */
  constructor(readonly offset: string, readonly json: Uint8Array) {}

  /** The AG-UI event, decoded. */
  event(): Record<string, unknown> {
    return JSON.parse(Buffer.from(this.json).toString("utf8"));
  }
}

/** Where a join starts: strictly after an offset, from the start, or only new chunks. */
export type Position = { afterOffset: string } | { fromStart: true } | { onlyNew: true } | { fromSnapshot: true };

/** `{ kind, ...options }`, e.g. `{ kind: "replay", journal: "claude-stream-json/hello.jsonl" }`. */
export type Agent = { kind: string } & Record<string, unknown>;

export interface StartRunOptions {
  runId: string;
  threadId: string;
  /** AG-UI messages, e.g. [{ id: "u1", role: "user", content: "hi" }]. */
  messages?: unknown[];
  /** Unset: the gateway's default agent. */
  agent?: Agent;
  cancelOnDisconnect?: boolean;
  interruptActive?: boolean;
  /** A busy thread: "reject" (default), "enqueue", "interrupt" or "steer" (docs/hitl.md). */
  multitask?: "reject" | "enqueue" | "interrupt" | "steer";
  parentRunId?: string;
  /** The thread's workspace, on its first run: `{ git, ref?, credential? }` or `{ dir }`, plus `setup?`. */
  workspace?: WorkspaceOptions;
}

export interface WorkspaceOptions {
  git?: string;
  ref?: string;
  credential?: string;
  dir?: string;
  setup?: string[];
}

export interface ClientOptions {
  /** The bearer API key (BATON_API_KEYS); unset without auth. */
  apiKey?: string;
  /** Default: insecure (plaintext). */
  credentials?: grpc.ChannelCredentials;
  /** Consecutive resumes without progress before a stream gives up (default 20). */
  maxRetries?: number;
  /** Deadline of unary calls, ms (default 30 000; a cancel with `wait` has none). */
  timeoutMs?: number;
  channelOptions?: grpc.ChannelOptions;
}

function resumable(err: BatonError): boolean {
  // UNAVAILABLE: the connection broke or the gateway's log read failed (LOG_UNAVAILABLE);
  // INTERNAL/UNKNOWN/CANCELLED without a reason: an HTTP/2 stream reset mid-stream.
  const codes = [grpc.status.UNAVAILABLE, grpc.status.INTERNAL, grpc.status.UNKNOWN, grpc.status.CANCELLED];
  return codes.includes(err.code) && err.reason !== "UNAUTHENTICATED";
}

const sleep = (ms: number) => new Promise<void>((ok) => setTimeout(ok, ms));

/**
 * The chunks of one run (async iterable, once), resumed after the last yielded offset when the
 * stream breaks. Throws a BatonError: OFFSET_EXPIRED (OUT_OF_RANGE) when the position is older
 * than retention, the error's own reason for any non-transient error.
 */
export class RunStream implements AsyncIterable<Chunk> {
  /** Offset of the last chunk yielded (undefined before the first). */
  lastOffset: string | undefined;
  /** The log's close status once it closed ("completed" | "failed" | "aborted" | "interrupted"). */
  status: string | undefined;
  /** The last notice ({reason, message}: why no chunk comes), cleared when chunks flow again. */
  notice: { reason: string; message: string } | undefined;
  /** How many times the stream was joined again after a break. */
  resumes = 0;
  private call: grpc.ClientReadableStream<RunEvent> | undefined;

  constructor(private readonly client: BatonRunsClient, readonly runId: string,
              private readonly start: RunStartRequest | undefined, private readonly position: Position,
              private readonly keepTtlSeconds = 0, private readonly snapshotMessages = 0) {}

  private open(): grpc.ClientReadableStream<RunEvent> {
    const { stub, metadata } = this.client.internals();
    const keepTtlSeconds = this.keepTtlSeconds;
    if (this.lastOffset !== undefined) {
      // A rejoin after a chunk it holds: a plain resume (the snapshot window was the first join's).
      return stub.joinRun({ runId: this.runId, afterOffset: this.lastOffset, keepTtlSeconds, snapshotMessages: 0 } as RunJoinRequest,
                          metadata);
    }
    if (this.start) return stub.startRun(this.start, metadata); // a retry with the same run id joins
    return stub.joinRun({ runId: this.runId, ...this.position, keepTtlSeconds, snapshotMessages: this.snapshotMessages } as RunJoinRequest,
                        metadata);
  }

  /** Stop reading (the iteration ends with a CANCELLED error if it was waiting). */
  cancel(): void {
    this.call?.cancel();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Chunk> {
    let failures = 0;
    for (;;) {
      const call = (this.call = this.open());
      try {
        for await (const ev of call as AsyncIterable<RunEvent>) {
          if (ev.notice) this.notice = { reason: ev.notice.reason, message: ev.notice.message };
          else if (ev.chunks.length) this.notice = undefined;
          for (const c of ev.chunks as LogChunk[]) {
            this.lastOffset = c.offset;
            failures = 0;
            yield new Chunk(c.offset, c.json);
          }
          if (ev.gap) {
            const after = this.lastOffset ?? ("afterOffset" in this.position ? this.position.afterOffset : "-1");
            throw new BatonError(grpc.status.OUT_OF_RANGE, "OFFSET_EXPIRED",
              `offset ${after} of run ${this.runId} is older than retention`,
              { run_id: this.runId, offset: after, earliest_offset: ev.gap.earliestOffset });
          }
          if (ev.end) {
            this.status = ev.end.status;
            return;
          }
        }
      } catch (err) {
        if (err instanceof BatonError) throw err;
        const e = BatonError.fromServiceError(err as grpc.ServiceError);
        if (!resumable(e) || failures >= this.client.maxRetries) throw e;
      } finally {
        call.cancel();
      }
      // Broken (or ended without its end): join again after the last offset held.
      await sleep(BACKOFF_MS[Math.min(failures, BACKOFF_MS.length - 1)]);
      failures += 1;
      this.resumes += 1;
    }
  }
}

/** Client of baton.v1.Runs (the gateway's gRPC address, `host:port`). */
export class BatonRunsClient {
  readonly maxRetries: number;
  private readonly stub: RunsStub;
  private readonly metadata: grpc.Metadata;
  private readonly timeoutMs: number;

  constructor(target = "127.0.0.1:8081", options: ClientOptions = {}) {
    this.stub = new RunsStub(target, options.credentials ?? grpc.credentials.createInsecure(),
                             { "grpc.enable_http_proxy": 0, ...options.channelOptions });
    this.metadata = new grpc.Metadata();
    if (options.apiKey) this.metadata.set("authorization", `Bearer ${options.apiKey}`);
    this.maxRetries = options.maxRetries ?? 20;
    this.timeoutMs = options.timeoutMs ?? 30_000;
  }

  /** @internal the stub and call metadata, for RunStream. */
  internals(): { stub: RunsStub; metadata: grpc.Metadata } {
    return { stub: this.stub, metadata: this.metadata };
  }

  close(): void {
    this.stub.close();
  }

  /** Start a run (or join it, when the run id exists) and stream its log from the start. */
  startRun(opts: StartRunOptions): RunStream {
    let agent;
    if (opts.agent) {
      const { kind, ...rest } = opts.agent;
      agent = { kind, optionsJson: JSON.stringify(rest) };
    }
    const req: RunStartRequest = {
      threadId: opts.threadId, runId: opts.runId, messagesJson: JSON.stringify(opts.messages ?? []), agent,
      cancelOnDisconnect: opts.cancelOnDisconnect ?? false, interruptActive: opts.interruptActive ?? false,
      parentRunId: opts.parentRunId ?? "", multitask: opts.multitask ?? "",
      workspace: opts.workspace ? {
        git: opts.workspace.git ?? "", ref: opts.workspace.ref ?? "", credential: opts.workspace.credential ?? "",
        dir: opts.workspace.dir ?? "", setup: opts.workspace.setup ?? [],
      } : undefined,
    };
    return new RunStream(this, opts.runId, req, { fromStart: true });
  }

  /**
   * The run's log from `position` (default: from the start) until it closes. `keepTtlSeconds`
   * (> 0): each join (and rejoin) also keeps the run that long should it become detached, as
   * `keepRun` does. `snapshotMessages` (1..1000, with `{ fromSnapshot: true }`): the snapshot
   * holds only its newest that many messages, after a `snapshot.window` chunk naming what was
   * left out (docs/api.md).
   */
  joinRun(runId: string, position: Position = { fromStart: true },
          opts: { keepTtlSeconds?: number; snapshotMessages?: number } = {}): RunStream {
    return new RunStream(this, runId, undefined, position, opts.keepTtlSeconds ?? 0, opts.snapshotMessages ?? 0);
  }

  /**
   * Keep the run at least `ttlSeconds` from now should it be (or become) detached, instead of the
   * reaper's default TTL. The gateway clamps it to its maximum (BATON_DETACHED_RUN_TTL_MAX):
   * `grantedSeconds` and `keptUntil` (Unix seconds) say what it granted. INVALID_ARGUMENT for a
   * value that is not finite and > 0; NOT_FOUND (UNKNOWN_RUN) for another tenant's run;
   * FAILED_PRECONDITION (RUN_ENDED) for an ended one.
   */
  keepRun(runId: string, ttlSeconds: number): Promise<RunKeepResponse> {
    return this.unary("keepRun", { runId, ttlSeconds });
  }

  private unary<Req, Res>(method: string, req: Req, timeoutMs: number | undefined = this.timeoutMs): Promise<Res> {
    const options: Partial<grpc.CallOptions> = timeoutMs === undefined ? {} : { deadline: Date.now() + timeoutMs };
    const fn = (this.stub as unknown as Record<string, Function>)[method].bind(this.stub);
    return new Promise((resolve, reject) => {
      fn(req, this.metadata, options, (err: grpc.ServiceError | null, res: Res) =>
        err ? reject(BatonError.fromServiceError(err)) : resolve(res));
    });
  }

  /** Cancel a run (or the thread's active run); with `wait`, until it is terminal (`run` = final RunInfo). */
  cancelRun(target: { runId?: string; threadId?: string; wait?: boolean; timeoutSeconds?: number }):
      Promise<RunCancelResponse> {
    const req: RunCancelRequest = { wait: target.wait ?? false, timeoutSeconds: target.timeoutSeconds ?? 0 };
    if (target.runId) req.runId = target.runId;
    else if (target.threadId) req.threadId = target.threadId;
    return this.unary("cancelRun", req, target.wait ? undefined : this.timeoutMs);
  }

  getRun(runId: string): Promise<RunInfo> {
    return this.unary("getRun", { runId });
  }

  /** The thread's active run id, or null. */
  async findActiveRun(threadId: string): Promise<string | null> {
    const r = await this.unary<object, ActiveRunResponse>("findActiveRun", { threadId });
    return r.runId || null;
  }

  /**
   * The thread's saved transcript: AG-UI messages, and its revision. With `pageSize` (1..1000)
   * only the newest messages of it, oldest of the page first; `pageToken` (a page's
   * `nextPageToken`) asks for the page just older; `nextPageToken` is "" when none is left.
   */
  async getTranscript(threadId: string, opts: { pageSize?: number; pageToken?: string } = {}): Promise<{
    threadId: string; revision: number; messages: unknown[]; nextPageToken: string; totalMessages: number; firstIndex: number;
  }> {
    const r = await this.unary<object, Transcript>(
      "getTranscript", { threadId, pageSize: opts.pageSize ?? 0, pageToken: opts.pageToken ?? "" });
    return {
      threadId: r.threadId, revision: r.revision, messages: r.messagesJson ? JSON.parse(r.messagesJson) : [],
      nextPageToken: r.nextPageToken, totalMessages: r.totalMessages, firstIndex: r.firstIndex,
    };
  }

  /**
   * A page of the run's messages from its latest snapshot, newest first (oldest of the page
   * first): the older messages a `joinRun(..., { snapshotMessages })` left out. `before`: the
   * `snapshot.window` chunk's `cursor` or a page's `nextCursor` (none: the newest page);
   * `limit` 1..1000 (0: every one before it). `nextCursor` is "" when none is left;
   * `snapshotOffset` "" when the run has no snapshot yet (no messages). INVALID_ARGUMENT for a
   * cursor that is not one of this run's; NOT_FOUND (UNKNOWN_RUN) for another tenant's run.
   */
  async getMessages(runId: string, opts: { limit?: number; before?: string } = {}): Promise<{
    runId: string; messages: unknown[]; total: number; firstIndex: number; nextCursor: string; snapshotOffset: string;
  }> {
    const r = await this.unary<object, RunMessagesPage>(
      "getMessages", { runId, limit: opts.limit ?? 0, before: opts.before ?? "" });
    return {
      runId: r.runId, messages: r.messagesJson ? JSON.parse(r.messagesJson) : [], total: r.total,
      firstIndex: r.firstIndex, nextCursor: r.nextCursor, snapshotOffset: r.snapshotOffset,
    };
  }

  /** A new thread starting where `runId` of `threadId` left its workspace and agent session. */
  async forkThread(threadId: string, runId: string, newThreadId: string): Promise<ThreadForkResponse> {
    return this.unary<object, ThreadForkResponse>("forkThread", { threadId, runId, newThreadId });
  }

  /** Delete a thread's workspace and saved transcript (THREAD_BUSY while a run of it goes). */
  async deleteThread(threadId: string): Promise<void> {
    await this.unary<object, ThreadDeleteResponse>("deleteThread", { threadId });
  }

  /** Every run of the caller (or of one thread), oldest first, page by page (from `pageToken`, a page's next_page_token). */
  async *listRuns(opts: { threadId?: string; pageSize?: number; pageToken?: string } = {}): AsyncIterable<RunInfo> {
    let pageToken = opts.pageToken ?? "";
    for (;;) {
      const page = await this.unary<object, RunListResponse>("listRuns",
        { threadId: opts.threadId ?? "", pageSize: opts.pageSize ?? 100, pageToken });
      yield* page.runs;
      pageToken = page.nextPageToken;
      if (!pageToken) return;
    }
  }

  listAgents(): Promise<AgentListResponse> {
    return this.unary("listAgents", {});
  }
}
