package kubernetes

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

// statusExitBase is the first exit code with which the one-shot operator
// reports a gRPC status (10 + code) on stdout instead of an output.
const statusExitBase = 10

// result turns a finished Job into the invocation's result or error.
func (b *Backend) result(ctx context.Context, inv *environment.Invocation, job *batchv1.Job) (*environment.Result, error) {
	if c := condition(job, batchv1.JobFailed); c != nil && c.Reason == batchv1.JobReasonDeadlineExceeded {
		return nil, fmt.Errorf("the invocation's timeout of %v passed (job %s: %s): %w", inv.Timeout, job.Name, c.Message, errs.DeadlineExceeded)
	}
	pod, term, err := b.terminated(ctx, inv.ID)
	if err != nil {
		return nil, err
	}
	if term == nil {
		reason := "complete"
		if c := condition(job, batchv1.JobFailed); c != nil {
			reason = "failed: " + c.Reason + ": " + c.Message
		}
		return nil, fmt.Errorf("job %s finished (%s) but no pod of it has a terminated operator container: %w", job.Name, reason, errs.Retryable)
	}
	if term.Reason == "OOMKilled" {
		return nil, fmt.Errorf("memory limit reached: the operator was killed at its limit of %d bytes; raise resources.memory: %w", inv.Limits.MemoryBytes, errs.ResourceExhausted)
	}

	logs, err := b.readLogs(ctx, pod.Name, inv.Limits.MaxOutputBytes)
	if err != nil {
		return nil, err
	}
	exit := int(term.ExitCode)
	line, rest := outputLine(logs, exit)
	out, err := environment.DecodeOutput(line, rest, exit)
	if err != nil {
		return nil, err
	}
	return &environment.Result{Output: out, Usage: &environmentv1.ResourceUsage{}, Logs: rest}, nil
}

// terminated returns the invocation's pod whose operator container has
// terminated (the latest, should there be several) and that container's
// state; a nil state when there is none.
func (b *Backend) terminated(ctx context.Context, id string) (*corev1.Pod, *corev1.ContainerStateTerminated, error) {
	pods, err := b.pods(ctx, id)
	if err != nil {
		return nil, nil, fmt.Errorf("list the pods of invocation %s: %v: %w", id, err, errs.Retryable)
	}
	var pod *corev1.Pod
	var term *corev1.ContainerStateTerminated
	for i := range pods {
		s := containerStatus(&pods[i])
		if s == nil || s.State.Terminated == nil {
			continue
		}
		if term == nil || term.FinishedAt.Before(&s.State.Terminated.FinishedAt) {
			pod, term = &pods[i], s.State.Terminated
		}
	}
	return pod, term, nil
}

// readLogs reads the log of pod's operator container: its stdout and
// stderr, merged. More than max bytes (0: maxOutputBytes) is
// RESOURCE_EXHAUSTED.
func (b *Backend) readLogs(ctx context.Context, pod string, max uint64) ([]byte, error) {
	rc, err := b.cfg.Logs(ctx, b.cfg.Namespace, pod)
	if err != nil {
		return nil, fmt.Errorf("read the log of pod %s: %v: %w", pod, err, errs.Retryable)
	}
	defer rc.Close()
	if max == 0 || max > maxOutputBytes {
		max = maxOutputBytes
	}
	data, err := io.ReadAll(io.LimitReader(rc, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("read the log of pod %s: %v: %w", pod, err, errs.Retryable)
	}
	if uint64(len(data)) > max {
		return nil, fmt.Errorf("the operator wrote more than resources.max_output_bytes (%d bytes, its log included, since Kubernetes merges stdout and stderr); raise the limit or log less: %w", max, errs.ResourceExhausted)
	}
	return data, nil
}

// outputLine finds the operator's stdout line in logs, where Kubernetes
// has merged it with the JSON log lines of stderr: the last line that
// decodes strictly (no unknown fields) as what exit code exit announces,
// a google.rpc.Status for 10 and above, else an OperatorOutput. It
// returns that line (nil when there is none) and the other lines.
func outputLine(logs []byte, exit int) (line, rest []byte) {
	var target func() proto.Message
	if exit >= statusExitBase {
		target = func() proto.Message { return &status.Status{} }
	} else {
		target = func() proto.Message { return &operatorv1.OperatorOutput{} }
	}
	lines := bytes.Split(logs, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		l := bytes.TrimSpace(lines[i])
		if len(l) == 0 || l[0] != '{' {
			continue
		}
		if protojson.Unmarshal(l, target()) != nil {
			continue
		}
		others := append(append([][]byte(nil), lines[:i]...), lines[i+1:]...)
		return l, bytes.Join(others, []byte("\n"))
	}
	return nil, logs
}
