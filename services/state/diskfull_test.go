package state

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// TestDiskFull: with its disk full, the bbolt service answers writes
// RESOURCE_EXHAUSTED with reason STORAGE_FULL and the cause (not
// INTERNAL), keeps serving reads, and takes the same write once space is
// freed, with no restart; the write is then durable and searchable.
func TestDiskFull(t *testing.T) {
	dir := testenv.SmallFS(t, 8<<20)
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return Run(ctx, Config{Server: devServer, Listener: lis, Log: harness.Logger(t), DataDir: dir})
	})
	c := statev1.NewStateServiceClient(harness.Dial(t, addr))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sc := scope.Session("full")
	big := strings.Repeat("lorem ipsum dolor sit amet ", 8<<10) // about 216 KiB: new pages every time
	write := func(key string) error {
		_, err := c.Write(ctx, &statev1.WriteRequest{Scope: sc, Key: key, Value: structpb.NewStringValue(big + key)})
		return err
	}
	if err := write("before"); err != nil {
		t.Fatalf("write before the disk is full: %v", err)
	}

	free := testenv.Fill(t, dir)
	var err error
	for i := 0; i < 8 && err == nil; i++ { // pages freed earlier may still take a write or two
		err = write(fmt.Sprintf("while-full-%d", i))
	}
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || errs.Reason(err) != errs.ReasonStorageFull || !strings.Contains(st.Message(), "no space left") {
		t.Fatalf("write on a full disk: %v %q (reason %q); want RESOURCE_EXHAUSTED, reason %s, naming the cause", st.Code(), st.Message(), errs.Reason(err), errs.ReasonStorageFull)
	}
	if r, err := c.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: "before"}); err != nil || r.GetValue().GetStringValue() != big+"before" {
		t.Fatalf("read while the disk is full: %v", err)
	}

	free()
	if err := write("after"); err != nil {
		t.Fatalf("the same write once space is freed, without a restart: %v", err)
	}
	if r, err := c.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: "after"}); err != nil || r.GetValue().GetStringValue() != big+"after" {
		t.Fatalf("read back after recovery: %v", err)
	}
	hits, err := c.Search(ctx, &statev1.SearchRequest{Scope: sc, Query: "lorem", Limit: 10})
	if err != nil {
		t.Fatalf("search after recovery: %v", err)
	}
	found := map[string]bool{}
	for _, h := range hits.GetResults() {
		found[h.GetKey()] = true
	}
	if !found["before"] || !found["after"] {
		t.Fatalf("search after recovery found %v; want before and after", found)
	}
}
