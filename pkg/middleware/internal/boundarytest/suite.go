package boundarytest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	"github.com/secbear/neuron/pkg/middleware/remote"
)

// Boundary is one boundary under test.
type Boundary struct {
	// Kind is the boundary, as the protocol names it.
	Kind middlewarev1.Boundary
	// Methods are the call shapes every case runs through.
	Methods []Method
	// HaltIsOutput: a halt answers a normal response whose output exits
	// EXIT_KIND_MIDDLEWARE_HALT (exec), not PERMISSION_DENIED.
	HaltIsOutput bool
	// HaltNames is what a PERMISSION_DENIED message must name, besides the
	// middleware and its reason, for a call carrying word (dispatch: the
	// agent; store: the key).
	HaltNames func(word string) []string
	// Replaced is what a MODIFY before replaces: "input" or "value".
	Replaced string
}

// Method is one way to call at the boundary.
type Method struct {
	Name string
	// Serve puts a fresh callee behind m at the boundary, with the
	// interceptors the boundary's service installs.
	Serve func(t *testing.T, m *remote.Middleware) Target
}

// Target is a callee behind the boundary, and a client of it.
type Target interface {
	// Call makes one call carrying word (see Policy) and returns what the
	// caller got. It checks what its call shape promises whatever the
	// verdict (e.g. the caller's request is not changed; a stream ends
	// with its output).
	Call(ctx context.Context, t *testing.T, word string) Result
	// Received is what reached the callee so far: the texts of the inputs
	// an agent ran, the values stored under the keys called.
	Received(t *testing.T) []string
	// Other makes a call the boundary does not see (another method, a
	// health check) and checks the callee's own answer.
	Other(ctx context.Context, t *testing.T)
}

// Result is what the caller of one Call got.
type Result struct {
	// Err is the call's error (the first, when Call made several calls).
	Err error
	// Output is the text of the output (dispatch, exec) or the value
	// read (store); "" when there is none.
	Output string
	// Halt is the exit message of an output exiting
	// EXIT_KIND_MIDDLEWARE_HALT; "" for any other output.
	Halt string
	// Calls is how many calls at the boundary Call made (a store Call
	// writes, then reads unless the write failed).
	Calls int
}

// Run runs the suite at b.
func Run(t *testing.T, b Boundary) {
	t.Run("verdicts", func(t *testing.T) { testVerdicts(t, b) })
	t.Run("fail policy", func(t *testing.T) { testFailPolicy(t, b) })
	t.Run("caller gives up", func(t *testing.T) { testCallerGivesUp(t, b) })
	t.Run("subscriptions", func(t *testing.T) { testSubscriptions(t, b) })
	t.Run("other calls pass through", func(t *testing.T) { testOtherCalls(t, b) })
}

func boundaryName(b middlewarev1.Boundary) string {
	return strings.ToLower(strings.TrimPrefix(b.String(), "BOUNDARY_"))
}

// wantHalt fails unless r is a halt by the middleware named name.
func wantHalt(t *testing.T, b Boundary, r Result, name, word string) {
	t.Helper()
	if b.HaltIsOutput {
		if r.Err != nil {
			t.Fatalf("a halt failed the call: %v", r.Err)
		}
		if !strings.Contains(r.Halt, HaltReason) || !strings.Contains(r.Halt, name) {
			t.Errorf("halt message %q lacks the reason or the middleware", r.Halt)
		}
		return
	}
	WantStatus(t, r.Err, codes.PermissionDenied, append([]string{fmt.Sprintf("%q", name), HaltReason}, b.HaltNames(word)...)...)
}

// testVerdicts: each verdict, before and after, is applied.
func testVerdicts(t *testing.T, b Boundary) {
	const name = "test-policy"
	var logs syncBuffer
	m := StartPolicy(t, &Policy{Name: name}, remote.Config{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if m.Name() != name {
		t.Fatalf("Name() = %q", m.Name())
	}
	tests := []struct {
		name     string
		word     string
		halt     bool
		code     codes.Code // when not a halt
		frags    []string   // in the error message
		received []string   // what the callee got
		output   string
	}{
		{"continue", Continue, false, codes.OK, nil, []string{Continue}, Continue},
		{"halt before: never reaches the callee", HaltBefore, true, 0, nil, nil, ""},
		{"modify before: the callee gets the replacement", ModifyBefore, false, codes.OK, nil, []string{Rewritten}, Rewritten},
		{"modify after: the caller gets the replacement", ModifyAfter, false, codes.OK, nil, []string{ModifyAfter}, Redacted},
		{"halt after: the result is withheld", HaltAfter, true, 0, nil, []string{HaltAfter}, ""},
		{"MODIFY without a replacement fails closed", BrokenModify, false, codes.Unavailable,
			[]string{fmt.Sprintf("%q", name), "MODIFY without a replacement " + b.Replaced}, nil, ""},
	}
	for _, method := range b.Methods {
		for _, tt := range tests {
			t.Run(method.Name+"/"+tt.name, func(t *testing.T) {
				target := method.Serve(t, m)
				r := target.Call(context.Background(), t, tt.word)
				if tt.halt {
					wantHalt(t, b, r, name, tt.word)
				} else {
					WantStatus(t, r.Err, tt.code, tt.frags...)
					if r.Halt != "" {
						t.Errorf("halted: %q", r.Halt)
					}
				}
				if got := target.Received(t); !Equal(got, tt.received) {
					t.Errorf("callee received %q, want %q", got, tt.received)
				}
				if r.Output != tt.output {
					t.Errorf("output %q, want %q", r.Output, tt.output)
				}
			})
		}
	}
	for _, want := range []string{"middleware=" + name, "boundary=" + boundaryName(b.Kind), "phase=before", "phase=after",
		"verdict=HALT", "verdict=MODIFY", `reason="` + HaltReason} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %q:\n%s", want, logs.String())
		}
	}
	for _, value := range []string{ModifyAfter, Redacted, Rewritten + `"`, HaltAfter} {
		if strings.Contains(logs.String(), value) {
			t.Errorf("a value (%q) was logged:\n%s", value, logs.String())
		}
	}
}

// testFailPolicy: a middleware that cannot answer (down, or slower than
// the timeout) fails a call UNAVAILABLE quickly when fail-closed, and lets
// it proceed when fail-open.
func testFailPolicy(t *testing.T, b Boundary) {
	// down: the middleware answered Describe, then stopped.
	down := func(t *testing.T, failOpen bool) *remote.Middleware {
		s, client := ServePolicy(t, &Policy{Name: "gone"})
		m, err := remote.New(context.Background(), client, remote.Config{Timeout: Quick, FailOpen: failOpen})
		if err != nil {
			t.Fatal(err)
		}
		s.Stop()
		return m
	}
	// unreachable: nothing ever listened; fail-open starts anyway.
	unreachable := func(t *testing.T, failOpen bool) *remote.Middleware {
		client := middlewarev1.NewMiddlewareServiceClient(Dial(t, ClosedAddr(t)))
		m, err := remote.New(context.Background(), client, remote.Config{Timeout: Quick, FailOpen: failOpen})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	slow := func(t *testing.T, failOpen bool) *remote.Middleware {
		return StartPolicy(t, &Policy{Name: "slow", Slow: true}, remote.Config{Timeout: Quick, FailOpen: failOpen})
	}
	tests := []struct {
		name     string
		failOpen bool
		mw       func(*testing.T, bool) *remote.Middleware
	}{
		{"down, fail-closed", false, down},
		{"down, fail-open", true, down},
		{"unreachable, fail-open", true, unreachable},
		{"slow, fail-closed", false, slow},
		{"slow, fail-open", true, slow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.mw(t, tt.failOpen)
			for _, method := range b.Methods {
				t.Run(method.Name, func(t *testing.T) {
					target := method.Serve(t, m)
					// Far longer than Quick: the middleware's own deadline
					// must end its calls, not the caller's.
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					start := time.Now()
					r := target.Call(ctx, t, HaltBefore)
					if d := time.Since(start); d > Within {
						t.Errorf("took %v", d)
					}
					if tt.failOpen {
						if r.Err != nil || r.Halt != "" || r.Output != HaltBefore || !Equal(target.Received(t), []string{HaltBefore}) {
							t.Fatalf("fail-open did not proceed: %v %q %q, received %q", r.Err, r.Output, r.Halt, target.Received(t))
						}
						return
					}
					WantStatus(t, r.Err, codes.Unavailable, m.Name())
					if got := target.Received(t); len(got) != 0 {
						t.Fatalf("fail-closed called anyway: %q", got)
					}
				})
			}
		})
	}
}

// testCallerGivesUp: when the caller's own deadline ends first, the call
// fails DEADLINE_EXCEEDED (not a verdict, not fail-open).
func testCallerGivesUp(t *testing.T, b Boundary) {
	m := StartPolicy(t, &Policy{Name: "slow", Slow: true}, remote.Config{Timeout: time.Minute, FailOpen: true})
	for _, method := range b.Methods {
		t.Run(method.Name, func(t *testing.T) {
			target := method.Serve(t, m)
			ctx, cancel := context.WithTimeout(context.Background(), Quick)
			defer cancel()
			r := target.Call(ctx, t, Continue)
			WantStatus(t, r.Err, codes.DeadlineExceeded)
			if got := target.Received(t); len(got) != 0 {
				t.Fatalf("called after the caller gave up: %q", got)
			}
		})
	}
}

// testSubscriptions: only the boundary/phase pairs Describe lists are
// sent.
func testSubscriptions(t *testing.T, b Boundary) {
	for _, method := range b.Methods {
		t.Run(method.Name+"/before only", func(t *testing.T) {
			p := &Policy{Name: "before-only", Subs: []*middlewarev1.Subscription{{Boundary: b.Kind, Phase: middlewarev1.Phase_PHASE_BEFORE}}}
			target := method.Serve(t, StartPolicy(t, p, remote.Config{}))
			r := target.Call(context.Background(), t, ModifyAfter)
			if r.Err != nil || r.Output != ModifyAfter {
				t.Fatalf("got %q, %v; want the unmodified output", r.Output, r.Err)
			}
			halted := target.Call(context.Background(), t, HaltBefore)
			wantHalt(t, b, halted, "before-only", HaltBefore)
			want := map[Point]int{{b.Kind, middlewarev1.Phase_PHASE_BEFORE}: r.Calls + halted.Calls}
			wantCalls(t, p, want)
			if got := target.Received(t); !Equal(got, []string{ModifyAfter}) {
				t.Errorf("callee received %q", got)
			}
		})
		t.Run(method.Name+"/other boundaries only", func(t *testing.T) {
			var others []middlewarev1.Boundary
			for _, o := range Boundaries {
				if o != b.Kind {
					others = append(others, o)
				}
			}
			p := &Policy{Name: "elsewhere", Subs: Subscribe(others...)}
			target := method.Serve(t, StartPolicy(t, p, remote.Config{}))
			if r := target.Call(context.Background(), t, HaltBefore); r.Err != nil || r.Halt != "" || r.Output != HaltBefore {
				t.Fatalf("%s not subscribed, yet: %q %q %v", boundaryName(b.Kind), r.Output, r.Halt, r.Err)
			}
			wantCalls(t, p, nil)
		})
	}
}

// wantCalls fails unless p was asked exactly want at every point.
func wantCalls(t *testing.T, p *Policy, want map[Point]int) {
	t.Helper()
	for _, bd := range Boundaries {
		for _, ph := range Phases {
			at := Point{bd, ph}
			if got := p.Calls(bd, ph); got != want[at] {
				t.Errorf("%s %s: %d calls, want %d", boundaryName(bd), ph, got, want[at])
			}
		}
	}
}

// testOtherCalls: calls that are not at the boundary pass through; the
// middleware is not asked.
func testOtherCalls(t *testing.T, b Boundary) {
	p := &Policy{Name: "p"}
	m := StartPolicy(t, p, remote.Config{})
	for _, method := range b.Methods {
		t.Run(method.Name, func(t *testing.T) {
			method.Serve(t, m).Other(context.Background(), t)
			wantCalls(t, p, nil)
		})
	}
}
