package kubernetes

import (
	"context"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/secbear/neuron/pkg/errs"
)

// configError reports whether a container waiting for reason waits for
// something no amount of waiting fixes: the pod's spec names something
// that does not exist.
func configError(reason string) bool {
	switch reason {
	case "CreateContainerConfigError", // e.g. a credential's Secret or key is missing
		"InvalidImageName",
		"ErrImageNeverPull":
		return true
	}
	return false
}

// wait returns the Job named name once it is Complete or Failed. It
// watches the Job and, every PollInterval, also reads it (in case the
// watch missed an event or broke) and the pod of invocation id (to fail
// fast on a configuration error). It returns ctx's error when ctx ends
// first.
func (b *Backend) wait(ctx context.Context, name, id string) (*batchv1.Job, error) {
	client, ns := b.cfg.Client, b.cfg.Namespace
	var w watch.Interface
	defer func() {
		if w != nil {
			w.Stop()
		}
	}()
	openWatch := func() {
		opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
		ww, err := client.WatchJobs(ctx, ns, opts)
		if err != nil {
			b.log.Debug("watch job; polling instead", "name", name, "error", err)
			return
		}
		w = ww
	}
	tick := time.NewTicker(b.cfg.PollInterval)
	defer tick.Stop()
	openWatch() // before the first Get, so no change falls between them

	for {
		job, err := client.GetJob(ctx, ns, name)
		switch {
		case err == nil:
			if finished(job) {
				return job, nil
			}
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("job %s was deleted before it finished: %w", name, errs.Retryable)
		default:
			b.log.Warn("read job", "name", name, "error", err)
		}
		if err := b.podConfigError(ctx, id); err != nil {
			return nil, err
		}
		if w == nil {
			openWatch()
		}

	events:
		for {
			var events <-chan watch.Event
			if w != nil {
				events = w.ResultChan()
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-tick.C:
				break events
			case ev, ok := <-events:
				if !ok {
					w.Stop()
					w = nil // reopened after the next poll
					continue
				}
				if j, isJob := ev.Object.(*batchv1.Job); isJob && j.Name == name && finished(j) {
					return j, nil
				}
			}
		}
	}
}

// finished reports whether job is Complete or Failed.
func finished(job *batchv1.Job) bool {
	return condition(job, batchv1.JobComplete) != nil || condition(job, batchv1.JobFailed) != nil
}

// condition returns job's condition of type t when it is true.
func condition(job *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i, c := range job.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return &job.Status.Conditions[i]
		}
	}
	return nil
}

// pods lists the pods of invocation id.
func (b *Backend) pods(ctx context.Context, id string) ([]corev1.Pod, error) {
	sel := labels.SelectorFromSet(labels.Set{InvocationLabel: id}).String()
	list, err := b.cfg.Client.ListPods(ctx, b.cfg.Namespace, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// podConfigError returns a FAILED_PRECONDITION error when the operator
// container of invocation id waits for a reason configError names.
func (b *Backend) podConfigError(ctx context.Context, id string) error {
	pods, err := b.pods(ctx, id)
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("list pods", "invocation", id, "error", err)
		}
		return nil
	}
	for _, p := range pods {
		s := containerStatus(&p)
		if s == nil || s.State.Waiting == nil || !configError(s.State.Waiting.Reason) {
			continue
		}
		return fmt.Errorf("the operator's container cannot start (%s: %s); check the image and the credentials' Secrets in namespace %s: %w",
			s.State.Waiting.Reason, s.State.Waiting.Message, b.cfg.Namespace, errs.FailedPrecondition)
	}
	return nil
}

// containerStatus returns the status of pod's operator container, or nil.
func containerStatus(pod *corev1.Pod) *corev1.ContainerStatus {
	for i, s := range pod.Status.ContainerStatuses {
		if s.Name == containerName {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}
