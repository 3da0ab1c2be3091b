package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/secbear/neuron/pkg/errs"
)

// MethodHTTPSchedules is the method an auth policy names to allow the
// schedules API (/v1/schedules).
const MethodHTTPSchedules = "/neuron.gateway.HTTP/Schedules"

// mountSchedules serves the schedules API:
//
//	POST   /v1/schedules         {"name", "agent", "cron", "message"} → 201, the schedule
//	GET    /v1/schedules         → {"schedules": [...]}
//	DELETE /v1/schedules/{name}  → 204
func (h *httpServer) mountSchedules(mux *http.ServeMux) {
	mux.Handle("POST /v1/schedules", h.authed(MethodHTTPSchedules, http.HandlerFunc(h.createSchedule)))
	mux.Handle("GET /v1/schedules", h.authed(MethodHTTPSchedules, http.HandlerFunc(h.listSchedules)))
	mux.Handle("DELETE /v1/schedules/{name}", h.authed(MethodHTTPSchedules, http.HandlerFunc(h.deleteSchedule)))
}

// scheduler is the gateway's scheduler, or why there is none.
func (h *httpServer) scheduler() (*Scheduler, error) {
	if h.g.sched == nil {
		return nil, fmt.Errorf("schedules are kept in the State service: start the gateway with --state-addr: %w", errs.FailedPrecondition)
	}
	return h.g.sched, nil
}

func (h *httpServer) createSchedule(w http.ResponseWriter, r *http.Request) {
	s, err := h.scheduler()
	if err != nil {
		httpError(w, err)
		return
	}
	var sc Schedule
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sc); err != nil {
		httpError(w, fmt.Errorf("the body is not a schedule {\"name\", \"agent\", \"cron\", \"message\"}: %v: %w", err, errs.InvalidArgument))
		return
	}
	out, err := s.Create(r.Context(), Schedule{Name: sc.Name, Agent: sc.Agent, Cron: sc.Cron, Message: sc.Message})
	if err != nil {
		httpError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(out)
}

func (h *httpServer) listSchedules(w http.ResponseWriter, r *http.Request) {
	s, err := h.scheduler()
	if err != nil {
		httpError(w, err)
		return
	}
	list, err := s.List(r.Context())
	if err != nil {
		httpError(w, err)
		return
	}
	writeJSON(w, map[string]any{"schedules": list})
}

func (h *httpServer) deleteSchedule(w http.ResponseWriter, r *http.Request) {
	s, err := h.scheduler()
	if err != nil {
		httpError(w, err)
		return
	}
	if err := s.Delete(r.Context(), r.PathValue("name")); err != nil {
		httpError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
