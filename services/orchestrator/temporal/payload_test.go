package temporal

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/encoding/protojson"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
)

// Every payload of the recorded histories decodes into this package's
// payload types with no field left over: a renamed or removed field, or
// one of another type, fails here before it fails a running workflow.
func TestPayloadsOfRecordedHistories(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(historyDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no recorded histories in %s", historyDir)
	}
	seen := map[string]int{}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			h, err := client.HistoryFromJSON(bytes.NewReader(raw), client.HistoryJSONOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// decode decodes a JSON payload strictly into a new value of
			// v's type.
			decode := func(what string, p *commonpb.Payload, v any) {
				t.Helper()
				if enc := string(p.GetMetadata()["encoding"]); enc != "json/plain" {
					t.Errorf("%s: payload encoding %q, want json/plain", what, enc)
					return
				}
				d := json.NewDecoder(bytes.NewReader(p.GetData()))
				d.DisallowUnknownFields()
				if err := d.Decode(v); err != nil {
					t.Errorf("%s: %s does not decode into %T: %v", what, p.GetData(), v, err)
					return
				}
				seen[reflect.TypeOf(v).Elem().Name()]++
			}
			first := func(ps *commonpb.Payloads) *commonpb.Payload {
				t.Helper()
				if len(ps.GetPayloads()) != 1 {
					t.Fatalf("%d payloads, want 1", len(ps.GetPayloads()))
				}
				return ps.GetPayloads()[0]
			}
			activities := map[int64]string{} // scheduled event id -> activity type
			for _, ev := range h.GetEvents() {
				switch ev.GetEventType() {
				case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
					decode("workflow input", first(ev.GetWorkflowExecutionStartedEventAttributes().GetInput()), &twInput{})
				case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
					a := ev.GetActivityTaskScheduledEventAttributes()
					activities[ev.GetEventId()] = a.GetActivityType().GetName()
					switch a.GetActivityType().GetName() {
					case twCallActivity:
						decode("call input", first(a.GetInput()), &callArgs{})
					case twEffActivity:
						decode("effect input", first(a.GetInput()), &effectArgs{})
					default:
						t.Errorf("unknown activity %s", a.GetActivityType().GetName())
					}
				case enumspb.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
					a := ev.GetActivityTaskCompletedEventAttributes()
					switch activities[a.GetScheduledEventId()] {
					case twCallActivity:
						decode("call result", first(a.GetResult()), &callResult{})
					case twEffActivity:
						decode("effect result", first(a.GetResult()), &effectOutcome{})
					}
				case enumspb.EVENT_TYPE_ACTIVITY_TASK_FAILED:
					if d := ev.GetActivityTaskFailedEventAttributes().GetFailure().GetApplicationFailureInfo().GetDetails(); d != nil {
						decode("activity failure", first(d), &failure{})
					}
				case enumspb.EVENT_TYPE_MARKER_RECORDED:
					m := ev.GetMarkerRecordedEventAttributes()
					if m.GetMarkerName() != "SideEffect" {
						continue
					}
					p := first(m.GetDetails()["data"])
					if string(p.GetMetadata()["encoding"]) == "json/protobuf" {
						// A budget decision, encoded by protojson.
						if err := protojson.Unmarshal(p.GetData(), &lifecyclev1.BudgetDecision{}); err != nil {
							t.Errorf("side effect %s is not a BudgetDecision: %v", p.GetData(), err)
						}
						seen["BudgetDecision"]++
						continue
					}
					decode("registry lookup", p, &agentInfo{})
				case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
					a := ev.GetWorkflowExecutionSignaledEventAttributes()
					switch a.GetSignalName() {
					case twSignal:
						decode("signal", first(a.GetInput()), &twSignalIn{})
					case twCancelSignal:
						var reason string
						decode("cancel reason", first(a.GetInput()), &reason)
					default:
						t.Errorf("unknown signal %s", a.GetSignalName())
					}
				case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
					decode("workflow result", first(ev.GetWorkflowExecutionCompletedEventAttributes().GetResult()), &twResult{})
				case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
					f := ev.GetWorkflowExecutionFailedEventAttributes().GetFailure()
					if f.GetApplicationFailureInfo().GetType() != errTypeWorkflow {
						t.Errorf("workflow failure of type %q, want %s", f.GetApplicationFailureInfo().GetType(), errTypeWorkflow)
					}
					decode("workflow failure", first(f.GetApplicationFailureInfo().GetDetails()), &failure{})
				}
			}
		})
	}
	// The histories exercise every payload type; a history set that no
	// longer does would let a type change unnoticed.
	for _, typ := range []string{"twInput", "callArgs", "callResult", "effectArgs", "effectOutcome", "agentInfo",
		"BudgetDecision", "twSignalIn", "twResult", "failure"} {
		if seen[typ] == 0 {
			t.Errorf("no payload of the recorded histories is a %s", typ)
		}
	}
}
