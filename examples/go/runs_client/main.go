// A Go client of baton's gRPC run API (baton.v1.Runs).
//
// What it does, as a user's client would:
//  1. StartRun: stream a run; after a few chunks the stream breaks (we cancel it)...
//  2. ...and JoinRun after the last offset we hold gets exactly the rest, to the end.
//  3. GetTranscript: the thread's saved messages.
//  4. A second run: CancelRun with wait, then its log to the end ("aborted").
//
// Build (see README.md here): generate the stubs (import path "baton.dev/v1", package batonv1) with protoc, then
// `go build` in GOPATH mode or in your module.
//
// Usage: runs_client <host:port> <thread_id> <run_id> <journal> [<thread2> <run2>]
// BATON_API_KEY: the bearer key when the gateway has BATON_API_KEYS. BATON_REPLAY_DELAY:
// seconds between the replay journal's lines (default 0.05).
// Prints one JSON object on stdout ({"ok": true, ...}); exits non-zero on failure.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	pb "baton.dev/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// codecV2 marshals with the protobuf API v2 the generated stubs use. Only needed with an
// old grpc-go (Debian's 1.33, whose default codec is github.com/golang/protobuf 1.3);
// grpc-go >= 1.35 does this by itself: drop it there.
type codecV2 struct{}

func (codecV2) Marshal(v any) ([]byte, error)   { return proto.Marshal(v.(proto.Message)) }
func (codecV2) Unmarshal(b []byte, v any) error { return proto.Unmarshal(b, v.(proto.Message)) }
func (codecV2) Name() string                    { return "proto" }

func init() { encoding.RegisterCodec(codecV2{}) }

// Both StartRun and JoinRun streams.
type eventStream interface {
	Recv() (*pb.RunEvent, error)
}

// read appends [offset, json] pairs to out. It returns the close status and true when the
// log closed; false when the stream broke or we stopped after stopAfter chunks.
func read(s eventStream, cancel context.CancelFunc, out *[][2]string, stopAfter int) (string, bool, error) {
	for {
		ev, err := s.Recv()
		if err == io.EOF {
			return "", false, nil // ended without `end`: the connection broke; join again
		}
		if err != nil {
			if c := status.Code(err); c == codes.Canceled || c == codes.Unavailable {
				return "", false, nil
			}
			return "", false, err
		}
		for _, c := range ev.Chunks {
			*out = append(*out, [2]string{c.Offset, string(c.Json)})
			if stopAfter > 0 && len(*out) >= stopAfter {
				cancel() // the stream breaks here; we resume from the last offset
				return "", false, nil
			}
		}
		if ev.Gap != nil {
			return "", false, fmt.Errorf("offset expired; earliest is %q", ev.Gap.EarliestOffset)
		}
		if ev.End != nil {
			return ev.End.Status, true, nil
		}
	}
}

// follow streams a run to its end, resuming after the last offset whenever it breaks.
func follow(ctx context.Context, client pb.RunsClient, runID string, out *[][2]string) (string, error) {
	for attempt := 0; attempt < 20; attempt++ {
		req := &pb.RunJoinRequest{RunId: runID, Position: &pb.RunJoinRequest_FromStart{FromStart: true}}
		if n := len(*out); n > 0 {
			req.Position = &pb.RunJoinRequest_AfterOffset{AfterOffset: (*out)[n-1][0]}
		}
		sctx, cancel := context.WithCancel(ctx)
		s, err := client.JoinRun(sctx, req)
		if err != nil {
			cancel()
			return "", err
		}
		st, closed, err := read(s, cancel, out, 0)
		cancel()
		if err != nil {
			return "", err
		}
		if closed {
			return st, nil
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	return "", fmt.Errorf("the stream kept breaking")
}

// replayDelay is BATON_REPLAY_DELAY: seconds between the replay journal's lines (default 0.05).
func replayDelay() float64 {
	if d, err := strconv.ParseFloat(os.Getenv("BATON_REPLAY_DELAY"), 64); err == nil {
		return d
	}
	return 0.05
}

func run() (map[string]any, error) {
	if len(os.Args) < 5 {
		fmt.Fprintln(os.Stderr, "usage: runs_client <host:port> <thread_id> <run_id> <journal> [<thread2> <run2>]")
		os.Exit(2)
	}
	address, threadID, runID, journal := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	// WithInsecure (plaintext) works with every grpc-go version, Debian's 1.33 included;
	// with grpc-go >= 1.34 prefer grpc.WithTransportCredentials(insecure.NewCredentials()).
	conn, err := grpc.Dial(address, grpc.WithInsecure())
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := pb.NewRunsClient(conn)
	ctx := context.Background()
	if key := os.Getenv("BATON_API_KEY"); key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+key)
	}
	messages := `[{"id":"u1","role":"user","content":"go"}]`
	agent := func(delay float64) *pb.AgentSpec {
		opts, _ := json.Marshal(map[string]any{"journal": journal, "speed": 1, "delay": delay})
		return &pb.AgentSpec{Kind: "replay", OptionsJson: string(opts)}
	}

	// 1 + 2: start, break after 3 chunks, resume after the last offset held.
	chunks := [][2]string{}
	sctx, cancel := context.WithCancel(ctx)
	s, err := client.StartRun(sctx, &pb.RunStartRequest{ThreadId: threadID, RunId: runID,
		MessagesJson: messages, Agent: agent(replayDelay())})
	if err != nil {
		cancel()
		return nil, err
	}
	st, closed, err := read(s, cancel, &chunks, 3)
	cancel()
	if err != nil {
		return nil, err
	}
	resumedAt := len(chunks)
	if !closed {
		if st, err = follow(ctx, client, runID, &chunks); err != nil {
			return nil, err
		}
	}
	// 3: the transcript.
	tr, err := client.GetTranscript(ctx, &pb.TranscriptRequest{ThreadId: threadID})
	if err != nil {
		return nil, err
	}
	var transcript any
	if err := json.Unmarshal([]byte(tr.MessagesJson), &transcript); err != nil {
		return nil, err
	}
	result := map[string]any{"ok": true, "chunks": chunks, "status": st, "resumedAt": resumedAt,
		"transcript": transcript}

	// 4: cancel a second run with wait.
	if len(os.Args) >= 7 {
		thread2, run2 := os.Args[5], os.Args[6]
		c2 := [][2]string{}
		sctx, cancel := context.WithCancel(ctx)
		s, err := client.StartRun(sctx, &pb.RunStartRequest{ThreadId: thread2, RunId: run2,
			MessagesJson: messages, Agent: agent(0.3)})
		if err != nil {
			cancel()
			return nil, err
		}
		if _, _, err := read(s, cancel, &c2, 2); err != nil {
			cancel()
			return nil, err
		}
		cancel()
		out, err := client.CancelRun(ctx, &pb.RunCancelRequest{Target: &pb.RunCancelRequest_RunId{RunId: run2},
			Wait: true, TimeoutSeconds: 60})
		if err != nil {
			return nil, err
		}
		result["cancelStatus"] = out.Run.Status.String()
		if result["cancelLogStatus"], err = follow(ctx, client, run2, &c2); err != nil {
			return nil, err
		}
		result["cancelChunks"] = c2
	}
	// A bad request: the error carries a status code (and a google.rpc.ErrorInfo detail).
	if _, err := client.GetRun(ctx, &pb.RunGetRequest{RunId: "no-such-run-" + runID}); err != nil {
		result["unknownCode"] = int(status.Code(err))
	}
	return result, nil
}

func main() {
	result, err := run()
	if err != nil {
		out, _ := json.Marshal(map[string]any{"ok": false, "error": err.Error(), "code": status.Code(err).String()})
		fmt.Println(string(out))
		os.Exit(1)
	}
	out, _ := json.Marshal(result)
	fmt.Println(string(out))
}
