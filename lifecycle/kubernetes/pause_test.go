package kubernetes

import (
	"context"
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandwake/sandwake/lifecycle"
)

// refuseResize makes the fake cluster answer every pods/resize patch with
// err.
func refuseResize(cs interface {
	PrependReactor(verb, resource string, fn k8stesting.ReactionFunc)
}, err error) {
	cs.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return a.GetSubresource() == "resize", nil, err
	})
}

// TestPauseWithoutResizeSubresource: an API server that answers 404 for
// pods/resize while the pod is there (older than 1.33) cannot pause:
// ErrPauseUnsupported, which the reaper turns into a stop, not
// ErrContainerNotFound.
func TestPauseWithoutResizeSubresource(t *testing.T) {
	r, cs := newFake(t)
	spec := testSpec()
	pausable(t, cs, r, "abc", spec)
	refuseResize(cs, apierrors.NewNotFound(schema.GroupResource{Resource: "pods/resize"}, "s-abc"))
	if err := r.Pause(context.Background(), "abc"); !errors.Is(err, lifecycle.ErrPauseUnsupported) || errors.Is(err, lifecycle.ErrContainerNotFound) {
		t.Fatalf("pause = %v, want ErrPauseUnsupported", err)
	}
}

// TestUnpauseRefusedDeletesThePod: a wake whose resize back is refused (the
// Role lost pods/resize after the pause) does not leave the app crawling
// at 1 % of a core: the pod is deleted and the error says the container
// is gone, so the Manager starts it again from its claim.
func TestUnpauseRefusedDeletesThePod(t *testing.T) {
	r, cs := newFake(t)
	pausable(t, cs, r, "abc", testSpec())
	ctx := context.Background()
	if err := r.Pause(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	refuseResize(cs, apierrors.NewForbidden(schema.GroupResource{Resource: "pods/resize"}, "s-abc", errors.New("no patch on pods/resize")))
	err := r.Unpause(ctx, "abc")
	if !errors.Is(err, lifecycle.ErrContainerNotFound) {
		t.Fatalf("unpause = %v, want ErrContainerNotFound", err)
	}
	if _, err := cs.CoreV1().Pods(testNS).Get(ctx, "s-abc", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the cut pod after a refused wake: %v, want deleted", err)
	}
	if c, err := r.Inspect(ctx, "abc"); err != nil || c.State != lifecycle.ContainerExited {
		t.Fatalf("inspect = %+v %v, want exited (the claim keeps the pod to start)", c, err)
	}
}
