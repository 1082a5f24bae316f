package kubernetes

import (
	"context"
	"errors"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file turns the pod informer's changes into the Docker-worded events
// lifecycle reconciles on: a pod deleted, or whose app ended, "died"
// (sandwake's own stops included, as Docker reports them).

// eventBuffer bounds how far an event stream may fall behind before it is
// ended (the Manager then resubscribes and reconciles in full).
const eventBuffer = 1024

// podChanged fires the waits on the pod's sandbox and reports its app's
// end (die, after oom for an OOM kill) and its start.
func (r *Runtime) podChanged(old, obj any) {
	pod, id, ok := r.changedPod(obj)
	if !ok {
		return
	}
	now := r.fromPod(id, pod)
	var was lifecycle.Container
	if p, ok := old.(*corev1.Pod); ok {
		was = r.fromPod(id, p)
	}
	switch {
	case now.State == was.State:
	case now.State == lifecycle.ContainerExited || now.State == lifecycle.ContainerDead:
		if now.OOMKilled {
			r.subs.publish(lifecycle.RuntimeEvent{SandboxID: id, Action: "oom"})
		}
		r.subs.publish(lifecycle.RuntimeEvent{SandboxID: id, Action: "die"})
	case now.State == lifecycle.ContainerRunning && old != nil:
		r.subs.publish(lifecycle.RuntimeEvent{SandboxID: id, Action: "start"})
	}
}

// changedPod fires the waits on the sandbox of obj, a pod the informer
// changed, and returns it when this instance owns it.
func (r *Runtime) changedPod(obj any) (pod *corev1.Pod, id string, ok bool) {
	pod, ok = obj.(*corev1.Pod)
	if !ok {
		return nil, "", false
	}
	id = pod.Labels[LabelID]
	r.changes.fire(id)
	return pod, id, r.owns(id, pod.Labels)
}

// podDeleted reports a pod's deletion as its app's end, unless its end was
// reported already.
func (r *Runtime) podDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	_, id, ok := r.changedPod(obj)
	if !ok {
		return
	}
	// The claim keeps the pod: to the Manager the container is there,
	// exited, whether or not its end was reported before.
	r.subs.publish(lifecycle.RuntimeEvent{SandboxID: id, Action: "die"})
}

// Events implements lifecycle.EventSource: the pod informer's changes of
// this instance's sandboxes, until ctx ends or the stream falls behind.
func (r *Runtime) Events(ctx context.Context) (<-chan lifecycle.RuntimeEvent, <-chan error) {
	s := r.subs.add()
	go func() {
		select {
		case <-ctx.Done():
			r.subs.remove(s, nil)
		case <-s.ended:
		}
	}()
	return s.out, s.errs
}

// subscribers are the open event streams.
type subscribers struct {
	mu     sync.Mutex
	subs   map[*subscriber]struct{}
	closed error
}

type subscriber struct {
	out   chan lifecycle.RuntimeEvent
	errs  chan error
	ended chan struct{}
}

func (s *subscribers) add() *subscriber {
	sub := &subscriber{out: make(chan lifecycle.RuntimeEvent, eventBuffer), errs: make(chan error, 1), ended: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed != nil {
		sub.errs <- s.closed
		close(sub.out)
		close(sub.ended)
		return sub
	}
	if s.subs == nil {
		s.subs = map[*subscriber]struct{}{}
	}
	s.subs[sub] = struct{}{}
	return sub
}

// remove ends sub's stream, with err (nil: its consumer left).
func (s *subscribers) remove(sub *subscriber, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeLocked(sub, err)
}

func (s *subscribers) removeLocked(sub *subscriber, err error) {
	if _, ok := s.subs[sub]; !ok {
		return
	}
	delete(s.subs, sub)
	if err != nil {
		sub.errs <- err
	}
	close(sub.out)
	close(sub.ended)
}

// publish hands ev to every stream without blocking the informer: a
// stream whose buffer is full is ended with an error.
func (s *subscribers) publish(ev lifecycle.RuntimeEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		select {
		case sub.out <- ev:
		default:
			s.removeLocked(sub, errors.New("kubernetes event stream fell behind"))
		}
	}
}

// closeAll ends every stream, and any opened later, with err.
func (s *subscribers) closeAll(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = err
	for sub := range s.subs {
		s.removeLocked(sub, err)
	}
}
