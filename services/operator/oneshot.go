package operator

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"buf.build/go/protovalidate"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/msgsize"
	"github.com/secbear/neuron/pkg/telemetry"
)

// MaxOneShotInput bounds the OperatorInput read from stdin in one-shot
// mode: the servers' message size limit.
const MaxOneShotInput = msgsize.Max

// One-shot exit codes. A status error exits with ExitStatusBase plus its
// gRPC code (e.g. 24 for UNAVAILABLE), so a shell can tell them apart.
const (
	ExitComplete   = 0  // output on stdout, exit kind COMPLETE
	ExitNotDone    = 3  // output on stdout, any other exit kind
	ExitStatusBase = 10 // google.rpc.Status on stdout
)

// OneShot runs one invocation without serving: an OperatorInput as
// protojson on stdin, the OperatorOutput as protojson on stdout. On
// failure stdout holds a google.rpc.Status as protojson (code, message
// and the ErrorInfo detail, exactly what a gRPC caller would receive) and
// stderr one line for a person. It returns the process exit code. This is
// how the environment service runs an operator inside isolation (through
// RunOneShot, which builds the operator from a Config): only data
// crosses the boundary.
//
// A failure always writes a Status, even when the error's text quotes
// input that is not UTF-8 (it is made valid, each bad byte a U+FFFD) or
// when the output itself cannot be encoded (an INTERNAL Status); only a
// stdout that cannot be written leaves it empty.
//
// When ProgressSocketEnv names a Unix socket, the progress events
// (those ExecuteStream sends, never the output) are written to it as
// they happen; see ProgressSocketEnv.
func (op *Operator) OneShot(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) int {
	progress := dialProgress(os.Getenv(ProgressSocketEnv), stderr)
	out, err := oneShot(ctx, op, stdin, progress.events())
	progress.close()
	if rec := spanRecorder.Load(); rec != nil {
		// Before the last line, which the environment quotes on failure.
		if dropped, err := rec.WriteSpans(stderr); err != nil || dropped > 0 {
			fmt.Fprintf(stderr, "operator: %d spans left out (%v)\n", dropped, err)
		}
	}
	if err != nil {
		return writeStatus(stdout, stderr, err)
	}
	b, err := protojson.Marshal(out)
	if err != nil {
		fmt.Fprintf(stderr, "operator: encoding output: %s\n", strings.ToValidUTF8(err.Error(), "\uFFFD"))
		return writeStatus(stdout, stderr, fmt.Errorf("encoding the output: %w", errs.Internal))
	}
	if _, err := stdout.Write(append(b, '\n')); err != nil {
		fmt.Fprintf(stderr, "operator: writing output: %v\n", err)
		return ExitStatusBase + int(errs.Unavailable.Code())
	}
	if out.GetExitReason().GetKind() != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
		return ExitNotDone
	}
	return ExitComplete
}

// writeStatus writes err as a google.rpc.Status on stdout and a line on
// stderr, and returns the exit code. The message is made valid UTF-8
// first (protojson refuses to encode anything else); should the details
// still not encode, the Status goes without them.
func writeStatus(stdout, stderr io.Writer, err error) int {
	st := errs.ToStatus(err)
	p := st.Proto()
	p.Message = strings.ToValidUTF8(p.Message, "\uFFFD")
	b, merr := protojson.Marshal(p)
	if merr != nil {
		b, merr = protojson.Marshal(&status.Status{Code: p.GetCode(), Message: p.GetMessage()})
	}
	if merr != nil {
		b = []byte(fmt.Sprintf(`{"code":%d}`, p.GetCode()))
	}
	_, _ = stdout.Write(append(b, '\n'))
	fmt.Fprintf(stderr, "operator: %s: %s\n", st.Code(), p.GetMessage())
	return ExitStatusBase + int(st.Code())
}

func oneShot(ctx context.Context, op *Operator, stdin io.Reader, events Events) (*operatorv1.OperatorOutput, error) {
	data, err := io.ReadAll(io.LimitReader(stdin, MaxOneShotInput+1))
	if err != nil {
		return nil, fmt.Errorf("reading OperatorInput from stdin: %v: %w", err, errs.InvalidArgument)
	}
	if len(data) > MaxOneShotInput {
		return nil, fmt.Errorf("OperatorInput on stdin is larger than %d bytes: %w", MaxOneShotInput, errs.LimitExceeded)
	}
	in := &operatorv1.OperatorInput{}
	if err := protojson.Unmarshal(data, in); err != nil {
		return nil, fmt.Errorf("stdin is not an OperatorInput in protojson: %v: %w", err, errs.InvalidArgument)
	}
	// The same rules the gRPC server checks before its handler runs.
	if err := protovalidate.Validate(&operatorv1.ExecuteRequest{Input: in}); err != nil {
		return nil, fmt.Errorf("%v: %w", err, errs.InvalidArgument)
	}
	// The trace the environment service put the run in: the spans of
	// the invocation go under its span (see spanRecorder).
	ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(in.GetDispatch().GetTraceContext()))
	return op.execute(ctx, in, events, true)
}

// spanRecorder, set by RunOneShot, records the spans of a one-shot
// invocation in memory: the sandbox has no network to export them. OneShot
// writes them on stderr, on one line before its last
// (telemetry.SpansPrefix), for the environment service to export under its
// span of the run. Only an input whose dispatch carries a sampled trace
// context (DispatchContext.trace_context, which the environment sets) has
// spans recorded.
var spanRecorder atomic.Pointer[telemetry.Recorder]

// ProgressSocketEnv is the environment variable through which the
// environment service gives a one-shot operator its progress socket: a
// Unix socket path. OneShot connects to it and writes each progress
// event as a frame, a 4-byte big-endian length then the
// ExecuteStreamResponse in binary protobuf, at most MaxProgressFrame
// bytes; the output still goes on stdout only. The environment's
// streaming Run (RunStream) passes the events on. Progress is best
// effort: a socket that cannot be reached or written ends the progress,
// never the invocation, and a slow reader makes the invocation wait.
const ProgressSocketEnv = "NEURON_PROGRESS_SOCKET"

// MaxProgressFrame bounds one progress frame (the environment service
// stops a run whose frame is larger). A tool result that would not fit
// is truncated in its frame, a tool input replaced by a note of its
// size; any other event that does not fit is left out. The output
// itself is never cut.
const MaxProgressFrame = 1 << 20

// progressWriter writes progress frames to the environment service. The
// zero value (no socket) drops them.
type progressWriter struct {
	mu   sync.Mutex
	conn net.Conn
	buf  []byte
}

// dialProgress connects to the progress socket at path; "" or a
// failure (told on stderr) gives a writer that drops everything.
func dialProgress(path string, stderr io.Writer) *progressWriter {
	if path == "" {
		return &progressWriter{}
	}
	conn, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		fmt.Fprintf(stderr, "operator: progress socket %s: %v; the run goes on without progress\n", path, err)
		return &progressWriter{}
	}
	return &progressWriter{conn: conn}
}

// events is what the invocation reports its progress to: nil without a
// socket, so that an invocation nobody streams runs as Execute does (a
// model call streams only when someone takes its text).
func (w *progressWriter) events() Events {
	if w.conn == nil {
		return nil
	}
	return w.send
}

// send writes ev as a frame. It never fails the invocation: after a
// write error it drops the rest.
func (w *progressWriter) send(ev *operatorv1.ExecuteStreamResponse) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn == nil {
		return nil
	}
	b, err := fitFrame(ev)
	if err != nil || b == nil {
		return nil
	}
	w.buf = binary.BigEndian.AppendUint32(w.buf[:0], uint32(len(b)))
	w.buf = append(w.buf, b...)
	if _, err := w.conn.Write(w.buf); err != nil {
		w.conn.Close()
		w.conn = nil
	}
	return nil
}

// close ends the progress, before the output is written.
func (w *progressWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn != nil {
		w.conn.Close()
		w.conn = nil
	}
}

// fitFrame encodes ev in at most MaxProgressFrame bytes: a long tool
// result truncated (on a character boundary, with a note of its size),
// a large tool input replaced by a note; nil when it cannot fit.
func fitFrame(ev *operatorv1.ExecuteStreamResponse) ([]byte, error) {
	b, err := proto.Marshal(ev)
	if err != nil || len(b) <= MaxProgressFrame {
		return b, err
	}
	const room = MaxProgressFrame - 4096 // for the other fields
	switch e := ev.GetEvent().(type) {
	case *operatorv1.ExecuteStreamResponse_ToolCallFinished:
		f := proto.Clone(e.ToolCallFinished).(*operatorv1.ToolCallFinished)
		n := len(f.GetResult())
		cut := min(room, n)
		for cut > 0 && cut < n && (f.Result[cut]&0xC0) == 0x80 {
			cut--
		}
		f.Result = f.Result[:cut] + fmt.Sprintf("\n[progress shows %d of the result's %d bytes]", cut, n)
		ev = &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallFinished{ToolCallFinished: f}}
	case *operatorv1.ExecuteStreamResponse_ToolCallStarted:
		s := proto.Clone(e.ToolCallStarted).(*operatorv1.ToolCallStarted)
		s.Input = structpb.NewStringValue(fmt.Sprintf("[an input of %d bytes, too large for progress]", proto.Size(e.ToolCallStarted.GetInput())))
		ev = &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallStarted{ToolCallStarted: s}}
	default:
		return nil, nil
	}
	if b, err = proto.Marshal(ev); err != nil || len(b) > MaxProgressFrame {
		return nil, err
	}
	return b, nil
}
