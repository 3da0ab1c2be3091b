package operator

import (
	"context"
	"fmt"
	"io"
	"strings"

	"buf.build/go/protovalidate"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/msgsize"
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
func (op *Operator) OneShot(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) int {
	out, err := oneShot(ctx, op, stdin)
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

func oneShot(ctx context.Context, op *Operator, stdin io.Reader) (*operatorv1.OperatorOutput, error) {
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
	return op.Execute(ctx, in, nil)
}
