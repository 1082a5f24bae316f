package lifecycle

import (
	"errors"
	"fmt"
)

// Errors of the lifecycle package. Errors returned by the Manager wrap one of
// these (test with errors.Is); the HTTP layer maps them to statuses in one
// place. ErrNotFound, ErrExists, ErrConflict and ErrStoreUnavailable are
// also what a Store's errors wrap.
var (
	// ErrNotFound: no sandbox with that id.
	ErrNotFound = errors.New("not found")
	// ErrExists: a sandbox with that id already exists.
	ErrExists = errors.New("already exists")
	// ErrConflict: the operation is not allowed in the sandbox's current
	// state (for example pausing a stopped sandbox, waking one being created).
	ErrConflict = errors.New("state conflict")
	// ErrInvalid: the request is malformed (bad id, spec or duration).
	ErrInvalid = errors.New("invalid request")
	// ErrCapacity: admission refused: the host is at max_resident and nothing
	// can be evicted.
	ErrCapacity = errors.New("no capacity")
	// ErrUnavailable: the container engine could not be reached or failed
	// transiently (daemon down, timeout, 5xx). The record is left unchanged;
	// retrying later may succeed.
	ErrUnavailable = errors.New("container engine unavailable")
	// ErrCircuitOpen: engine calls are refused without trying, for a few
	// seconds after repeated engine failures. It wraps ErrUnavailable.
	ErrCircuitOpen = fmt.Errorf("%w: circuit open", ErrUnavailable)
	// ErrPauseUnsupported: the engine cannot freeze a sandbox (see
	// Pauser). It wraps ErrConflict: the sandbox can be stopped instead.
	ErrPauseUnsupported = fmt.Errorf("%w: the container engine cannot pause sandboxes (stop them instead)", ErrConflict)
	// ErrContainerNotFound: the engine has no container for the sandbox.
	ErrContainerNotFound = errors.New("container not found")
	// ErrGroupIncomplete: a group lacks one of its containers while its
	// app's is there. Errors carrying it carry ErrContainerNotFound too
	// (to a wake and to reconcile the group is gone), but what is left of
	// it must still be removed.
	ErrGroupIncomplete = errors.New("a container of the group is missing")
	// ErrImageNotFound: the image is not on the engine and could not be pulled.
	ErrImageNotFound = errors.New("image not available")
	// ErrIDTaken: the sandbox's container or volume name is held by
	// something this gateway does not own (another instance's sandbox, or a
	// container or volume sandwake never made). Nothing of it is touched.
	ErrIDTaken = errors.New("id taken")
	// ErrNotReady: the sandbox's port did not become ready within wake_timeout.
	ErrNotReady = errors.New("not ready")
	// ErrClosed: the manager has been closed.
	ErrClosed = errors.New("manager closed")
	// ErrCloseTimeout: Close stopped waiting for work in flight.
	ErrCloseTimeout = errors.New("closing the manager timed out")
	// ErrStoreUnavailable: the store refused the write (file system full
	// below its reserve, read-only, failing). An engine change made before
	// it is re-read and recorded once the store takes writes again.
	ErrStoreUnavailable = errors.New("store not writable")
	// ErrPoolEmpty: a create with "pool":"require" found no idle container
	// of its template.
	ErrPoolEmpty = errors.New("pool empty")
)
