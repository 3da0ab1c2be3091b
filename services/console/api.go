package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/yaml"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
)

// marshal is the protojson the API answers with (the proto's JSON
// names, enums by name, unset fields left out).
var marshal = protojson.MarshalOptions{}

// writeProto writes m as the JSON answer.
func writeProto(w http.ResponseWriter, m proto.Message) {
	b, err := marshal.Marshal(m)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "INTERNAL", "internal error")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// badRequest writes a 400 for a malformed request to the console.
func badRequest(w http.ResponseWriter, format string, a ...any) {
	writeError(w, http.StatusBadRequest, "INVALID_ARGUMENT", fmt.Sprintf(format, a...))
}

// readJSON decodes the request body into v.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		badRequest(w, "the request body is not the JSON expected: %v", err)
		return false
	}
	return true
}

// workflowStatus parses a status filter: "", "RUNNING" or
// "WORKFLOW_STATUS_RUNNING".
func workflowStatus(s string) (orchestratorv1.WorkflowStatus, bool) {
	if s == "" {
		return orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED, true
	}
	s = strings.ToUpper(s)
	if !strings.HasPrefix(s, "WORKFLOW_STATUS_") {
		s = "WORKFLOW_STATUS_" + s
	}
	v, ok := orchestratorv1.WorkflowStatus_value[s]
	return orchestratorv1.WorkflowStatus(v), ok
}

// pageSize parses an optional page_size parameter.
func pageSize(r *http.Request) (int32, error) {
	v := r.URL.Query().Get("page_size")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("page_size %q is not a number", v)
	}
	return int32(n), nil
}

// listWorkflowsPage is one page of ListWorkflows, filtered by agent.
func (s *Server) listWorkflowsPage(r *http.Request, sess *session) (*orchestratorv1.ListWorkflowsResponse, error) {
	q := r.URL.Query()
	st, ok := workflowStatus(q.Get("status"))
	if !ok {
		return nil, errBadParam{fmt.Sprintf("status %q: want running, suspended, completed, failed or canceled", q.Get("status"))}
	}
	n, err := pageSize(r)
	if err != nil {
		return nil, errBadParam{err.Error()}
	}
	resp, err := s.orch.ListWorkflows(r.Context(), &orchestratorv1.ListWorkflowsRequest{Status: st, PageSize: n, PageToken: q.Get("page_token")}, s.callOpts(sess)...)
	if err != nil {
		return nil, err
	}
	if agent := q.Get("agent"); agent != "" {
		kept := resp.Workflows[:0]
		for _, wf := range resp.Workflows {
			if wf.GetRootAgentId() == agent || wf.GetCurrentAgentId() == agent {
				kept = append(kept, wf)
			}
		}
		resp.Workflows = kept
	}
	return resp, nil
}

// errBadParam is a bad query parameter of the console's own API.
type errBadParam struct{ msg string }

func (e errBadParam) Error() string { return e.msg }

// listWorkflows is GET /api/workflows?status=&agent=&page_token=.
func (s *Server) listWorkflows(w http.ResponseWriter, r *http.Request, sess *session) {
	resp, err := s.listWorkflowsPage(r, sess)
	if bp, ok := err.(errBadParam); ok {
		badRequest(w, "%s", bp.msg)
		return
	}
	if err != nil {
		fail(w, sess, "ListWorkflows", err)
		return
	}
	writeProto(w, resp)
}

// startWorkflow is POST /api/workflows {agentId, text, workflowId}.
func (s *Server) startWorkflow(w http.ResponseWriter, r *http.Request, sess *session) {
	var body struct {
		AgentID    string `json:"agentId"`
		Text       string `json:"text"`
		WorkflowID string `json:"workflowId"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	in := &operatorv1.OperatorInput{Message: content.Text(body.Text), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER}
	resp, err := s.orch.StartWorkflow(r.Context(), &orchestratorv1.StartWorkflowRequest{AgentId: body.AgentID, WorkflowId: body.WorkflowID, Input: in}, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "StartWorkflow", err)
		return
	}
	writeProto(w, resp)
}

// getWorkflow is GET /api/workflows/{id}.
func (s *Server) getWorkflow(w http.ResponseWriter, r *http.Request, sess *session) {
	resp, err := s.orch.GetWorkflow(r.Context(), &orchestratorv1.GetWorkflowRequest{WorkflowId: r.PathValue("id")}, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "GetWorkflow", err)
		return
	}
	writeProto(w, resp)
}

// maxTranscriptPages bounds the pages one transcript answer reads.
const maxTranscriptPages = 50

// transcript is GET /api/workflows/{id}/transcript: every page of
// GetTranscript (at most maxTranscriptPages of 100 steps; nextPageToken
// is set when there are more).
func (s *Server) transcript(w http.ResponseWriter, r *http.Request, sess *session) {
	out := &orchestratorv1.GetTranscriptResponse{}
	token := r.URL.Query().Get("page_token")
	for range maxTranscriptPages {
		resp, err := s.orch.GetTranscript(r.Context(), &orchestratorv1.GetTranscriptRequest{WorkflowId: r.PathValue("id"), PageSize: 100, PageToken: token}, s.callOpts(sess)...)
		if err != nil {
			fail(w, sess, "GetTranscript", err)
			return
		}
		out.Steps = append(out.Steps, resp.Steps...)
		token = resp.NextPageToken
		if token == "" {
			break
		}
	}
	out.NextPageToken = token
	writeProto(w, out)
}

// cancelWorkflow is POST /api/workflows/{id}/cancel {reason}.
func (s *Server) cancelWorkflow(w http.ResponseWriter, r *http.Request, sess *session) {
	var body struct {
		Reason string `json:"reason"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	resp, err := s.orch.CancelWorkflow(r.Context(), &orchestratorv1.CancelWorkflowRequest{WorkflowId: r.PathValue("id"), Reason: body.Reason}, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "CancelWorkflow", err)
		return
	}
	writeProto(w, resp)
}

// signalWorkflow is POST /api/workflows/{id}/signal {signalType, data}.
func (s *Server) signalWorkflow(w http.ResponseWriter, r *http.Request, sess *session) {
	var body struct {
		SignalType string          `json:"signalType"`
		Data       json.RawMessage `json:"data"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	payload := &typesv1.SignalPayload{SignalType: body.SignalType}
	if len(body.Data) > 0 {
		v := &structpb.Value{}
		if err := protojson.Unmarshal(body.Data, v); err != nil {
			badRequest(w, "data: %v", err)
			return
		}
		payload.Data = v
	}
	resp, err := s.orch.Signal(r.Context(), &orchestratorv1.SignalRequest{WorkflowId: r.PathValue("id"), Signal: payload}, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "Signal", err)
		return
	}
	writeProto(w, resp)
}

// decide is POST /api/workflows/{id}/decide with the body of a
// DecideApprovalsRequest ({"decisions": [{"toolUseId", "approved",
// "editedInput", "reason"}]}); the path names the workflow.
func (s *Server) decide(w http.ResponseWriter, r *http.Request, sess *session) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		badRequest(w, "the request body: %v", err)
		return
	}
	req := &orchestratorv1.DecideApprovalsRequest{}
	if err := protojson.Unmarshal(b, req); err != nil {
		badRequest(w, "the decisions are not a DecideApprovalsRequest: %v", err)
		return
	}
	req.WorkflowId = r.PathValue("id")
	for _, d := range req.Decisions {
		if d.DecidedBy == "" {
			d.DecidedBy = "console"
		}
	}
	resp, err := s.orch.DecideApprovals(r.Context(), req, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "DecideApprovals", err)
		return
	}
	writeProto(w, resp)
}

// updateLimits is POST /api/workflows/{id}/limits with the body of an
// UpdateWorkflowLimitsRequest ({"budget": {"amount": "2"}, "maxSteps",
// "reject", "reason", "idempotencyKey"}); the path names the workflow.
func (s *Server) updateLimits(w http.ResponseWriter, r *http.Request, sess *session) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		badRequest(w, "the request body: %v", err)
		return
	}
	req := &orchestratorv1.UpdateWorkflowLimitsRequest{}
	if err := protojson.Unmarshal(b, req); err != nil {
		badRequest(w, "the change is not an UpdateWorkflowLimitsRequest: %v", err)
		return
	}
	req.WorkflowId = r.PathValue("id")
	resp, err := s.orch.UpdateWorkflowLimits(r.Context(), req, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "UpdateWorkflowLimits", err)
		return
	}
	writeProto(w, resp)
}

// listApprovals is GET /api/approvals?workflow=&page_token=.
func (s *Server) listApprovals(w http.ResponseWriter, r *http.Request, sess *session) {
	q := r.URL.Query()
	n, err := pageSize(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	resp, err := s.orch.ListApprovals(r.Context(), &orchestratorv1.ListApprovalsRequest{WorkflowId: q.Get("workflow"), PageSize: n, PageToken: q.Get("page_token")}, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "ListApprovals", err)
		return
	}
	writeProto(w, resp)
}

// listAgents is GET /api/agents?page_token=.
func (s *Server) listAgents(w http.ResponseWriter, r *http.Request, sess *session) {
	n, err := pageSize(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	resp, err := s.agents.ListAgents(r.Context(), &agentv1.ListAgentsRequest{PageSize: n, PageToken: r.URL.Query().Get("page_token")}, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "ListAgents", err)
		return
	}
	writeProto(w, resp)
}

// agentYAML is an agent's definition as the editor shows it: the YAML
// `neuron agents get` prints (name and definition only).
func agentYAML(a *agentv1.Agent) (string, error) {
	b, err := protojson.Marshal(&agentv1.Agent{Name: a.GetName(), Definition: a.GetDefinition()})
	if err != nil {
		return "", err
	}
	y, err := yaml.JSONToYAML(b)
	return string(y), err
}

// getAgent is GET /api/agents/{name}: {"agent": Agent, "yaml": "..."}.
func (s *Server) getAgent(w http.ResponseWriter, r *http.Request, sess *session) {
	resp, err := s.agents.GetAgent(r.Context(), &agentv1.GetAgentRequest{Name: r.PathValue("name")}, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "GetAgent", err)
		return
	}
	y, err := agentYAML(resp.Agent)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "INTERNAL", "internal error")
		return
	}
	a, _ := marshal.Marshal(resp.Agent)
	writeJSON(w, map[string]any{"agent": json.RawMessage(a), "yaml": y})
}

// saveAgent is POST /api/agents {yaml, expectedRevision}: it creates the
// agent the YAML (or JSON) defines when expectedRevision is 0, else
// updates it from that revision. The agent service validates it; its
// field violations come back in "fields".
func (s *Server) saveAgent(w http.ResponseWriter, r *http.Request, sess *session) {
	var body struct {
		YAML             string `json:"yaml"`
		ExpectedRevision uint64 `json:"expectedRevision,string"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	j, err := yaml.YAMLToJSON([]byte(body.YAML))
	if err != nil {
		writeAPIError(w, http.StatusBadRequest, apiError{Code: "INVALID_ARGUMENT", Message: "the definition is not valid YAML: " + err.Error(),
			Fields: []fieldViolation{{Field: "yaml", Description: err.Error()}}})
		return
	}
	a := &agentv1.Agent{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(bytes.TrimSpace(j), a); err != nil {
		writeAPIError(w, http.StatusBadRequest, apiError{Code: "INVALID_ARGUMENT", Message: "the definition does not match layer0.agent.v1.Agent: " + err.Error(),
			Fields: []fieldViolation{{Field: "yaml", Description: err.Error()}}})
		return
	}
	var saved *agentv1.Agent
	if body.ExpectedRevision == 0 {
		resp, err := s.agents.CreateAgent(r.Context(), &agentv1.CreateAgentRequest{Agent: a}, s.callOpts(sess)...)
		if err != nil {
			fail(w, sess, "CreateAgent", err)
			return
		}
		saved = resp.Agent
	} else {
		resp, err := s.agents.UpdateAgent(r.Context(), &agentv1.UpdateAgentRequest{Agent: a, ExpectedRevision: body.ExpectedRevision}, s.callOpts(sess)...)
		if err != nil {
			fail(w, sess, "UpdateAgent", err)
			return
		}
		saved = resp.Agent
	}
	y, _ := agentYAML(saved)
	out, _ := marshal.Marshal(saved)
	writeJSON(w, map[string]any{"agent": json.RawMessage(out), "yaml": y})
}

// scopeOf parses ?scope=global|workflow|session|agent|custom&id=&agent=.
func scopeOf(r *http.Request) (*typesv1.Scope, error) {
	q := r.URL.Query()
	id := q.Get("id")
	switch q.Get("scope") {
	case "global", "":
		return &typesv1.Scope{Kind: &typesv1.Scope_Global{Global: &typesv1.GlobalScope{}}}, nil
	case "workflow":
		return &typesv1.Scope{Kind: &typesv1.Scope_Workflow{Workflow: &typesv1.WorkflowScope{WorkflowId: id}}}, nil
	case "session":
		return &typesv1.Scope{Kind: &typesv1.Scope_Session{Session: &typesv1.SessionScope{SessionId: id}}}, nil
	case "agent":
		return &typesv1.Scope{Kind: &typesv1.Scope_Agent{Agent: &typesv1.AgentScope{WorkflowId: id, AgentId: q.Get("agent")}}}, nil
	case "custom":
		return &typesv1.Scope{Kind: &typesv1.Scope_Custom{Custom: &typesv1.CustomScope{Name: id}}}, nil
	}
	return nil, fmt.Errorf("scope %q: want global, workflow, session, agent or custom", q.Get("scope"))
}

// stateList is GET /api/state/list?scope=&id=&prefix=&page_token=.
func (s *Server) stateList(w http.ResponseWriter, r *http.Request, sess *session) {
	sc, err := scopeOf(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	n, err := pageSize(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	q := r.URL.Query()
	resp, err := s.state.List(r.Context(), &statev1.ListRequest{Scope: sc, Prefix: q.Get("prefix"), PageSize: n, PageToken: q.Get("page_token")}, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "StateList", err)
		return
	}
	writeProto(w, resp)
}

// stateRead is GET /api/state/read?scope=&id=&key=.
func (s *Server) stateRead(w http.ResponseWriter, r *http.Request, sess *session) {
	sc, err := scopeOf(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	resp, err := s.state.Read(r.Context(), &statev1.ReadRequest{Scope: sc, Key: r.URL.Query().Get("key")}, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "StateRead", err)
		return
	}
	writeProto(w, resp)
}

// stateSearch is GET /api/state/search?scope=&id=&q=.
func (s *Server) stateSearch(w http.ResponseWriter, r *http.Request, sess *session) {
	sc, err := scopeOf(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	resp, err := s.state.Search(r.Context(), &statev1.SearchRequest{Scope: sc, Query: r.URL.Query().Get("q"), Limit: 50}, s.callOpts(sess)...)
	if err != nil {
		fail(w, sess, "StateSearch", err)
		return
	}
	writeProto(w, resp)
}
