package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// fakeState is a session's entries in a StateService client: List pages
// through the keys (in byte order, as State does), Read answers each
// with its entry, or with the code failing names for it.
type fakeState struct {
	statev1.StateServiceClient
	entries  map[string]string // key -> the one user message it holds
	failing  map[string]codes.Code
	reads    atomic.Int32
	inFlight atomic.Int32
	mu       sync.Mutex
	most     int32
}

func (f *fakeState) List(_ context.Context, req *statev1.ListRequest, _ ...grpc.CallOption) (*statev1.ListResponse, error) {
	keys := make([]string, 0, len(f.entries))
	for k := range f.entries {
		if k > req.GetPageToken() {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	resp := &statev1.ListResponse{}
	for _, k := range keys[:min(len(keys), int(req.GetPageSize()))] {
		resp.Items = append(resp.Items, &statev1.ListItem{Key: k, Revision: 1})
	}
	if len(keys) > int(req.GetPageSize()) {
		resp.NextPageToken = resp.Items[len(resp.Items)-1].GetKey()
	}
	return resp, nil
}

func (f *fakeState) Read(ctx context.Context, req *statev1.ReadRequest, _ ...grpc.CallOption) (*statev1.ReadResponse, error) {
	f.reads.Add(1)
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	f.mu.Lock()
	f.most = max(f.most, n)
	f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	if c, ok := f.failing[req.GetKey()]; ok {
		return nil, status.Error(c, "injected")
	}
	text, ok := f.entries[req.GetKey()]
	if !ok {
		return nil, status.Error(codes.NotFound, "no such key")
	}
	v, err := encodeEntry("", []provider.Message{{Role: provider.User, Parts: []provider.Part{{Text: text}}}})
	if err != nil {
		return nil, err
	}
	return &statev1.ReadResponse{Value: v, Revision: 1}, nil
}

func session(n int) *fakeState {
	f := &fakeState{entries: map[string]string{}, failing: map[string]codes.Code{}}
	for i := range n {
		f.entries[fmt.Sprintf("%s%06d", HistoryPrefix, i)] = strconv.Itoa(i)
	}
	return f
}

func texts(msgs []provider.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Parts[0].Text
	}
	return out
}

// A long session loads whole and in order (two List pages, reads in
// parallel), or its last maxEntries entries.
func TestLoadManyEntriesInOrder(t *testing.T) {
	for _, tt := range []struct{ entries, max, want int }{{1500, 0, 1500}, {1500, 100, 100}, {5, 100, 5}, {0, 0, 0}} {
		f := session(tt.entries)
		msgs, err := StateHistory{Client: f}.Load(context.Background(), "s", tt.max)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]string, tt.want)
		for i := range want {
			want[i] = strconv.Itoa(tt.entries - tt.want + i)
		}
		if got := texts(msgs); !slices.Equal(got, want) {
			t.Fatalf("%d entries, max %d: got %d messages %.60v, want %.60v", tt.entries, tt.max, len(got), got, want)
		}
		if int(f.reads.Load()) != tt.want || f.most > HistoryReads {
			t.Errorf("%d reads, %d at once; want %d, at most %d", f.reads.Load(), f.most, tt.want, HistoryReads)
		}
	}
}

// An entry deleted between List and Read is left out; any other failure
// fails the load with its kind.
func TestLoadReadFailures(t *testing.T) {
	f := session(50)
	delete(f.entries, HistoryPrefix+"000007") // listed, then gone
	f.failing[HistoryPrefix+"000003"] = codes.NotFound
	msgs, err := StateHistory{Client: &listed{f, session(50)}}.Load(context.Background(), "s", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := texts(msgs); len(got) != 48 || slices.Contains(got, "3") || slices.Contains(got, "7") || got[3] != "4" || got[47] != "49" {
		t.Fatalf("got %v", got)
	}

	for code, kind := range map[codes.Code]*errs.Kind{codes.Unavailable: errs.Retryable, codes.PermissionDenied: errs.NonRetryable} {
		f := session(50)
		f.failing[HistoryPrefix+"000020"] = code
		_, err := StateHistory{Client: f}.Load(context.Background(), "s", 0)
		if !errors.Is(err, kind) {
			t.Errorf("%v: got %v, want %v", code, err, kind)
		}
	}
}

// listed lists the keys of one session and reads from another.
type listed struct {
	*fakeState
	list *fakeState
}

func (l *listed) List(ctx context.Context, req *statev1.ListRequest, opts ...grpc.CallOption) (*statev1.ListResponse, error) {
	return l.list.List(ctx, req, opts...)
}
