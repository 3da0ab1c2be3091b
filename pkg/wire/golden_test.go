// Changing a fixture in testdata/ is a deliberate wire change. The
// fixtures are what other languages and stored data see; regenerate them
// only when the change is intended, with
//
//	go test ./pkg/wire -update
//
// and review the diff like a proto change.

package wire_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden is one fixture: testdata/<name>.json holds msg's JSON form.
type golden struct {
	name string
	msg  proto.Message
}

func TestGoldenJSON(t *testing.T) {
	cases := goldenCases(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join("testdata", tc.name+".json")
			raw, err := protojson.Marshal(tc.msg)
			if err != nil {
				t.Fatal(err)
			}
			// protojson randomizes whitespace on purpose; normalize it.
			got, err := normalizeJSON(raw)
			if err != nil {
				t.Fatal(err)
			}
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./pkg/wire -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("JSON of %s differs from %s; if the wire change is deliberate, run go test ./pkg/wire -update\ngot:\n%s\nwant:\n%s",
					tc.name, path, got, want)
			}

			// The fixture decodes to exactly the message built in Go.
			decoded := tc.msg.ProtoReflect().Type().New().Interface()
			if err := protojson.Unmarshal(want, decoded); err != nil {
				t.Fatalf("unmarshal %s: %v", path, err)
			}
			if !proto.Equal(decoded, tc.msg) {
				t.Errorf("%s decodes to\n %v\nwant\n %v", path, decoded, tc.msg)
			}
		})
	}

	// A fixture without a case is stale: it pins nothing.
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		if !slices.ContainsFunc(cases, func(g golden) bool { return g.name == name }) {
			t.Errorf("%s has no golden case; delete it or add the case", f)
		}
	}
}

// normalizeJSON compacts then indents b with two spaces, ending in a
// newline, so that only content (never protojson's random spacing) counts.
func normalizeJSON(b []byte) ([]byte, error) {
	var compact, out bytes.Buffer
	if err := json.Compact(&compact, b); err != nil {
		return nil, err
	}
	if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// goldenCases builds the pinned messages by hand. Every one is valid
// under its buf.validate rules; TestGoldenMessagesAreValid checks that.
func goldenCases(t *testing.T) []golden {
	t.Helper()
	val := func(v any) *structpb.Value {
		t.Helper()
		pv, err := structpb.NewValue(v)
		if err != nil {
			t.Fatal(err)
		}
		return pv
	}
	strct := func(m map[string]any) *structpb.Struct {
		t.Helper()
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	money := func(s string) *typesv1.Money { return &typesv1.Money{Amount: s} }
	ts := func(s string) *timestamppb.Timestamp {
		t.Helper()
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return timestamppb.New(tm)
	}
	sessionScope := &typesv1.Scope{Kind: &typesv1.Scope_Session{Session: &typesv1.SessionScope{SessionId: "sess-42"}}}
	workflowScope := &typesv1.Scope{Kind: &typesv1.Scope_Workflow{Workflow: &typesv1.WorkflowScope{WorkflowId: "wf-7"}}}

	output := &operatorv1.OperatorOutput{
		Message: content.Text("I need your approval to send the email."),
		ExitReason: &operatorv1.ExitReason{
			Kind:    operatorv1.ExitKind_EXIT_KIND_SUSPENDED,
			Message: "approval required",
			Suspension: &operatorv1.Suspension{
				ResumeToken: "resume-abc",
				Prompt:      "Send the summary to the team?",
				Pending:     val(map[string]any{"tool": "send_email", "to": "team@example.com"}),
			},
		},
		Metadata: &operatorv1.OperatorMetadata{
			TokensIn:  1200,
			TokensOut: 340,
			Cost:      money("0.0125"),
			TurnsUsed: 3,
			SubDispatches: []*operatorv1.SubDispatchRecord{
				{Name: "search", Duration: durationpb.New(250 * time.Millisecond), Success: true},
				{Name: "read_file", Duration: durationpb.New(time.Second), Error: "no such file"},
			},
			Duration:         durationpb.New(4*time.Second + 500*time.Millisecond),
			CacheReadTokens:  800,
			CacheWriteTokens: 100,
			Model:            "claude-sonnet-4-5",
			Provider:         "anthropic",
		},
		Effects: []*typesv1.Effect{
			{IdempotencyKey: "d-1/0", Kind: &typesv1.Effect_WriteMemory{WriteMemory: &typesv1.WriteMemory{
				Scope: sessionScope, Key: "notes/summary", Value: val("Q3 revenue up 4%"),
			}}},
			{IdempotencyKey: "d-1/1", Kind: &typesv1.Effect_DeleteMemory{DeleteMemory: &typesv1.DeleteMemory{
				Scope: sessionScope, Key: "notes/draft",
			}}},
			{IdempotencyKey: "d-1/2", Kind: &typesv1.Effect_Signal{Signal: &typesv1.SignalEffect{
				WorkflowId: "wf-other",
				Payload:    &typesv1.SignalPayload{SignalType: "user_feedback", Data: val(map[string]any{"rating": 5})},
			}}},
			{IdempotencyKey: "d-1/3", Kind: &typesv1.Effect_Delegate{Delegate: &typesv1.Delegate{
				AgentId:  "researcher",
				Message:  content.Text("Find last year's Q3 figures."),
				Metadata: strct(map[string]any{"priority": "high"}),
			}}},
			{IdempotencyKey: "d-1/4", Kind: &typesv1.Effect_Handoff{Handoff: &typesv1.Handoff{
				AgentId: "writer", State: val(map[string]any{"draft_key": "notes/summary"}),
			}}},
			{IdempotencyKey: "d-1/5", Kind: &typesv1.Effect_Log{Log: &typesv1.LogEffect{
				Level: typesv1.LogLevel_LOG_LEVEL_WARN, Message: "slow tool", Data: val(map[string]any{"ms": 1000}),
			}}},
			{IdempotencyKey: "d-1/6", Kind: &typesv1.Effect_Custom{Custom: &typesv1.CustomEffect{
				EffectType: "acme.email/v1", Data: val(map[string]any{"to": "team@example.com"}),
			}}},
		},
		Annotations: strct(map[string]any{"route": "support"}),
	}

	budgetEvent := func(e *lifecyclev1.BudgetEvent) *lifecyclev1.LifecycleEvent {
		return &lifecyclev1.LifecycleEvent{
			Sequence: 17, Time: ts("2025-06-01T12:00:00.5Z"), WorkflowId: "wf-7", AgentId: "writer", CorrelationId: "corr-1",
			Event: &lifecyclev1.LifecycleEvent_Budget{Budget: e},
		}
	}
	compactionEvent := func(e *lifecyclev1.CompactionEvent) *lifecyclev1.LifecycleEvent {
		return &lifecyclev1.LifecycleEvent{
			Sequence: 18, Time: ts("2025-06-01T12:00:01Z"), WorkflowId: "wf-7", AgentId: "writer", CorrelationId: "corr-1",
			Event: &lifecyclev1.LifecycleEvent_Compaction{Compaction: e},
		}
	}

	return []golden{
		{"operator_input", &operatorv1.OperatorInput{
			Message:   content.Text("Summarize the Q3 report."),
			Trigger:   operatorv1.TriggerType_TRIGGER_TYPE_USER,
			SessionId: proto.String("sess-42"),
			Config: &operatorv1.OperatorConfig{
				MaxTurns:       proto.Uint32(8),
				MaxCost:        money("0.50"),
				MaxDuration:    durationpb.New(90 * time.Second),
				Model:          proto.String("claude-sonnet-4-5"),
				AllowedTools:   &operatorv1.AllowedTools{Names: []string{"read_file", "search"}},
				SystemAddendum: proto.String("Answer in French."),
			},
			Metadata: strct(map[string]any{"tenant": "acme", "priority": 2}),
			Dispatch: &operatorv1.DispatchContext{
				DispatchId:       "d-1",
				WorkflowId:       "wf-7",
				AgentId:          "writer",
				ParentDispatchId: "d-0",
				CausationId:      "msg-9",
				CorrelationId:    "corr-1",
				Depth:            1,
				TraceContext: map[string]string{
					"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
					"tracestate":  "acme=1",
				},
			},
		}},
		{"operator_input_resume_custom_trigger", &operatorv1.OperatorInput{
			Message:       content.Text("approved"),
			Trigger:       operatorv1.TriggerType_TRIGGER_TYPE_CUSTOM,
			CustomTrigger: "acme.approval/v1",
			Resume:        &operatorv1.Resume{ResumeToken: "resume-abc", Decision: val(map[string]any{"approved": true})},
		}},
		{"operator_output", output},

		{"content_block_text", content.TextBlock("Hello, wörld")},
		{"content_block_image_url", content.ImageURL("https://example.com/chart.png")},
		{"content_block_image_data", content.ImageData("image/png", []byte("\x89PNG\r\n\x1a\n"))},
		{"content_block_tool_use", content.ToolUse("toolu_01", "read_file", val(map[string]any{"path": "/reports/q3.md"}))},
		{"content_block_tool_result", content.ToolResult("toolu_01", "no such file", true)},
		{"content_block_custom", content.Custom("acme.audio/v1", val(map[string]any{"url": "https://example.com/a.ogg", "seconds": 12}))},

		{"scope_session", sessionScope},
		{"scope_workflow", workflowScope},
		{"scope_agent", &typesv1.Scope{Kind: &typesv1.Scope_Agent{Agent: &typesv1.AgentScope{WorkflowId: "wf-7", AgentId: "writer"}}}},
		{"scope_global", &typesv1.Scope{Kind: &typesv1.Scope_Global{Global: &typesv1.GlobalScope{}}}},
		{"scope_custom", &typesv1.Scope{Kind: &typesv1.Scope_Custom{Custom: &typesv1.CustomScope{Name: "tenant:acme"}}}},

		{"state_write_request_must_not_exist", &statev1.WriteRequest{
			Scope:            workflowScope,
			Key:              "plan",
			Value:            val(map[string]any{"steps": []any{"research", "write"}}),
			ExpectedRevision: proto.Uint64(0),
			IdempotencyKey:   "d-1/0",
		}},

		{"environment_spec", &environmentv1.EnvironmentSpec{
			Isolation: []*environmentv1.IsolationBoundary{
				{Kind: &environmentv1.IsolationBoundary_Process{Process: &environmentv1.ProcessIsolation{}}},
				{Kind: &environmentv1.IsolationBoundary_Container{Container: &environmentv1.ContainerIsolation{Image: "ghcr.io/acme/operator:1.2"}}},
				{Kind: &environmentv1.IsolationBoundary_Gvisor{Gvisor: &environmentv1.GvisorIsolation{}}},
				{Kind: &environmentv1.IsolationBoundary_Microvm{Microvm: &environmentv1.MicroVmIsolation{}}},
				{Kind: &environmentv1.IsolationBoundary_Wasm{Wasm: &environmentv1.WasmIsolation{Runtime: "wasmtime"}}},
				{Kind: &environmentv1.IsolationBoundary_NetworkPolicy{NetworkPolicy: &environmentv1.NetworkPolicyIsolation{
					Rules: []*environmentv1.NetworkRule{{Destination: "10.0.0.0/8", Action: environmentv1.NetworkAction_NETWORK_ACTION_DENY}},
				}}},
				{Kind: &environmentv1.IsolationBoundary_Custom{Custom: &environmentv1.CustomIsolation{
					BoundaryType: "acme.seccomp/v1", Config: val(map[string]any{"profile": "strict"}),
				}}},
			},
			Credentials: []*environmentv1.CredentialRef{
				{Name: "anthropic-api-key", Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_EnvVar{
					EnvVar: &environmentv1.EnvVarInjection{VarName: "ANTHROPIC_API_KEY"},
				}}},
				{Name: "gcp-sa", Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_File{
					File: &environmentv1.FileInjection{Path: "/run/secrets/gcp.json"},
				}}},
				{Name: "github-token", Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_Sidecar{
					Sidecar: &environmentv1.SidecarInjection{Host: "api.github.com", Header: "authorization"},
				}}},
			},
			Resources: &environmentv1.ResourceLimits{
				Cpu:            proto.String("500m"),
				Memory:         proto.String("512Mi"),
				Disk:           proto.String("1Gi"),
				Gpu:            proto.String("0"),
				MaxProcesses:   proto.Uint32(64),
				MaxOutputBytes: proto.Uint64(1 << 20),
				CpuTime:        durationpb.New(30 * time.Second),
			},
			Network: &environmentv1.NetworkPolicy{
				DefaultAction: environmentv1.NetworkAction_NETWORK_ACTION_DENY,
				Rules: []*environmentv1.NetworkRule{
					{Destination: "api.anthropic.com", Port: proto.Uint32(443), Action: environmentv1.NetworkAction_NETWORK_ACTION_ALLOW},
				},
			},
			Timeout: durationpb.New(5 * time.Minute),
		}},

		{"lifecycle_cost_incurred", budgetEvent(&lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_CostIncurred{
			CostIncurred: &lifecyclev1.CostIncurred{AgentId: "writer", Cost: money("0.003"), Cumulative: money("0.0125")},
		}})},
		{"lifecycle_budget_warning", budgetEvent(&lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_BudgetWarning{
			BudgetWarning: &lifecyclev1.BudgetWarning{WorkflowId: "wf-7", Spent: money("0.9"), Limit: money("1")},
		}})},
		{"lifecycle_budget_action", budgetEvent(&lifecyclev1.BudgetEvent{Kind: &lifecyclev1.BudgetEvent_BudgetAction{
			BudgetAction: &lifecyclev1.BudgetAction{WorkflowId: "wf-7", Decision: &lifecyclev1.BudgetDecision{
				Kind:      lifecyclev1.BudgetDecisionKind_BUDGET_DECISION_KIND_DOWNGRADE_MODEL,
				FromModel: "claude-sonnet-4-5",
				ToModel:   "claude-haiku-4-5",
			}},
		}})},
		{"lifecycle_context_pressure", compactionEvent(&lifecyclev1.CompactionEvent{Kind: &lifecyclev1.CompactionEvent_ContextPressure{
			ContextPressure: &lifecyclev1.ContextPressure{AgentId: "writer", FillPercent: 87.5, TokensUsed: 175000, TokensAvailable: 200000},
		}})},
		{"lifecycle_pre_compaction_flush", compactionEvent(&lifecyclev1.CompactionEvent{Kind: &lifecyclev1.CompactionEvent_PreCompactionFlush{
			PreCompactionFlush: &lifecyclev1.PreCompactionFlush{AgentId: "writer", Scope: sessionScope},
		}})},
		{"lifecycle_compaction_complete", compactionEvent(&lifecyclev1.CompactionEvent{Kind: &lifecyclev1.CompactionEvent_CompactionComplete{
			CompactionComplete: &lifecyclev1.CompactionComplete{AgentId: "writer", Strategy: "summarize", TokensFreed: 120000, ProviderManaged: true},
		}})},
		{"lifecycle_observable", &lifecyclev1.LifecycleEvent{
			Sequence: 19, Time: ts("2025-06-01T12:00:02Z"), WorkflowId: "wf-7", CorrelationId: "corr-1",
			Event: &lifecyclev1.LifecycleEvent_Observable{Observable: &lifecyclev1.ObservableEvent{
				Source:             lifecyclev1.EventSource_EVENT_SOURCE_ORCHESTRATOR,
				EventType:          "orchestrator.effect.applied",
				SinceWorkflowStart: durationpb.New(2 * time.Second),
				Data:               val(map[string]any{"idempotency_key": "d-1/0"}),
				TraceId:            "4bf92f3577b34da6a3ce929d0e0e4736",
			}},
		}},

		{"middleware_intercept_store_request", &middlewarev1.InterceptStoreRequest{
			Phase:     middlewarev1.Phase_PHASE_BEFORE,
			Operation: middlewarev1.StoreOperation_STORE_OPERATION_WRITE,
			Scope:     sessionScope,
			Key:       "profile/email",
			Value:     val("someone@example.com"),
		}},

		{"orchestrator_workflow", &orchestratorv1.Workflow{
			WorkflowId:     "wf-7",
			Status:         orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED,
			RootAgentId:    "triage",
			CurrentAgentId: "writer",
			Steps:          4,
			Spent:          money("1.0125"),
			Budget:         money("1"),
			LastOutput:     output,
			Failure:        &typesv1.Status{Code: 8, Message: "workflow budget of 1 spent", Reason: "LIMIT_EXCEEDED", Metadata: map[string]string{"budget": "1"}},
			CreateTime:     ts("2025-06-01T11:59:00Z"),
			UpdateTime:     ts("2025-06-01T12:00:02.25Z"),
			PendingSignals: 1,
		}},
	}
}
