package web

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/sandwake/sandwake/client"
	"github.com/sandwake/sandwake/cluster"
	"github.com/sandwake/sandwake/lifecycle"
)

// ErrorStatus maps an engine error to its HTTP status, error code and
// Retry-After seconds (0: none). It is the one place this mapping lives.
func ErrorStatus(err error) (status int, code string, retryAfter int) {
	switch {
	case errors.Is(err, cluster.ErrTaken):
		return http.StatusConflict, "id_taken", 0
	case errors.Is(err, cluster.ErrEtcd):
		return http.StatusServiceUnavailable, "cluster_unavailable", 5
	case errors.Is(err, cluster.ErrNoRoom):
		return http.StatusServiceUnavailable, "no_room", 5
	case errors.Is(err, cluster.ErrUnknownNode):
		return http.StatusNotFound, "unknown_node", 0
	case errors.Is(err, cluster.ErrUnsigned):
		return http.StatusForbidden, "unsigned_forward", 0
	case errors.Is(err, lifecycle.ErrEgressUnenforced):
		return http.StatusServiceUnavailable, "egress_unenforced", 30
	case errors.Is(err, lifecycle.ErrNotFound):
		return http.StatusNotFound, "not_found", 0
	case errors.Is(err, lifecycle.ErrInvalid):
		return http.StatusBadRequest, "invalid", 0
	case errors.Is(err, lifecycle.ErrIDTaken):
		return http.StatusConflict, "id_taken", 0
	case errors.Is(err, lifecycle.ErrExists):
		return http.StatusConflict, "exists", 0
	case errors.Is(err, lifecycle.ErrConflict):
		return http.StatusConflict, "conflict", 0
	case errors.Is(err, lifecycle.ErrCapacity):
		return http.StatusServiceUnavailable, "capacity", 5
	case errors.Is(err, lifecycle.ErrPoolEmpty):
		return http.StatusServiceUnavailable, "pool_empty", 1
	case errors.Is(err, lifecycle.ErrUnavailable), errors.Is(err, lifecycle.ErrClosed):
		return http.StatusServiceUnavailable, "unavailable", 5
	case errors.Is(err, lifecycle.ErrStoreUnavailable):
		return http.StatusServiceUnavailable, "store_unavailable", StoreRetryAfter
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, "timeout", 1
	case errors.Is(err, lifecycle.ErrImageNotFound):
		return http.StatusUnprocessableEntity, "image_missing", 0
	case errors.Is(err, lifecycle.ErrNotReady):
		return http.StatusBadGateway, "not_ready", 0
	default:
		return http.StatusBadGateway, "failed", 0
	}
}

// StoreRetryAfter is the Retry-After, in seconds, while the store refuses
// writes: the manager looks at it again every second.
const StoreRetryAfter = 5

// WriteError writes {"error":{…}} with status and, when retryAfter > 0, a
// Retry-After header.
func WriteError(w http.ResponseWriter, status int, code, message string, retryAfter int) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(client.ErrorResponse{Error: client.ErrorBody{Code: code, Message: message}})
}

// WriteEngineError answers err as JSON with its mapped status.
func WriteEngineError(w http.ResponseWriter, err error) {
	status, code, retry := ErrorStatus(err)
	WriteError(w, status, code, plainMessage(err, code), retry)
}

// plainMessage is err's text for an API answer: the sentinel's words that
// the code already says ("invalid request: ") are left out, so that a 400
// reads "ports: at least one port is required"; the engine's own words
// (host paths, driver ids) are left out too, for a reference to the log
// that has them (lifecycle.PublicMessage).
func plainMessage(err error, code string) string {
	msg := lifecycle.PublicMessage(err)
	if code == "invalid" {
		msg = strings.Replace(msg, lifecycle.ErrInvalid.Error()+": ", "", 1)
	}
	return msg
}

// WriteJSON writes v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
