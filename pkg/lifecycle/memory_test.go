package lifecycle

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// The flood: streams Subscribe streams from clients client addresses
// (127.0.1.1, 127.0.1.2, ...), opened by a child process that never reads
// them, against a server with the default limits and buffers.
const (
	floodStreams = 2000
	floodClients = 20
	floodPad     = 4500 // bytes of payload per event: over 4 KiB, one of gRPC's pooled buffer sizes
	floodBatch   = 32   // events published between two reads of the reader
	floodMax     = 8192 // events published at most before every flood stream must have been ended
	floodEnv     = "LIFECYCLE_FLOOD_ADDR"
)

// floodReport is what the child process prints, as one "REPORT " line
// per phase.
type floodReport struct {
	// Open phase.
	Admitted  map[string]int // by client address
	Refused   map[string]int // code and message, the client address blanked -> count
	OtherErrs []string
	// Drain phase: every admitted stream read to its end.
	Drained  int
	Events   int            // in all
	Ends     map[string]int // final status code -> count
	Problems []string       // streams whose events or status do not add up (at most a few)
}

// TestUnreadSubscribersMemory opens floodStreams Subscribe streams that
// never read (from a child process, so that the heap measured here is
// the server's alone), then publishes events, paced by one subscriber
// that reads, until every unread stream has been ended. It checks:
//
//   - the caps: DefaultMaxStreams streams are admitted, no client holds
//     more than DefaultMaxStreamsPerClient, and every other stream is
//     refused at once with RESOURCE_EXHAUSTED naming the cap's flag;
//   - the buffer bound: every unread stream is ended with
//     RESOURCE_EXHAUSTED "did not keep up", and when its client finally
//     reads, it finds contiguous events up to the sequence the status
//     names to resubscribe after;
//   - the reader receives every event, in order;
//   - the heap in use grows by less than floodBound.
//
// It never asserts on timing: it waits (within the hang guard of the
// harness and the go test timeout) for the outcomes it checks.
func TestUnreadSubscribersMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 2,000 streams")
	}
	bus := NewBus(Options{})
	h := start(t, bus, harnessOptions{})
	ctx, cancelReader := context.WithCancel(context.Background())
	defer cancelReader()

	// The reader: subscribed first, so the caps leave it in.
	reader := subscribed(t, ctx, h, &lifecyclev1.SubscribeRequest{})
	before := memory()

	child := startFlood(t, h.addr)
	open := child.report(t)
	t.Logf("flood: %d streams admitted of %d, by client %v", total(open.Admitted), floodStreams, open.Admitted)
	if len(open.OtherErrs) > 0 {
		t.Fatalf("streams failed otherwise than refused: %v", open.OtherErrs)
	}
	// One stream is the reader's.
	if got := total(open.Admitted); got != DefaultMaxStreams-1 {
		t.Errorf("admitted %d flood streams, want %d (the total cap, less the reader)", got, DefaultMaxStreams-1)
	}
	for c, n := range open.Admitted {
		if n > DefaultMaxStreamsPerClient {
			t.Errorf("client %s holds %d streams, over the cap of %d", c, n, DefaultMaxStreamsPerClient)
		}
	}
	perClient := fmt.Sprintf("--%s=%d", FlagMaxStreamsPerClient, DefaultMaxStreamsPerClient)
	totalCap := fmt.Sprintf("--%s=%d", FlagMaxStreams, DefaultMaxStreams)
	refused := 0
	for msg, n := range open.Refused {
		refused += n
		if !strings.HasPrefix(msg, "ResourceExhausted: too many lifecycle subscriptions") || !(strings.Contains(msg, perClient) || strings.Contains(msg, totalCap)) {
			t.Errorf("%d streams refused with %q; want RESOURCE_EXHAUSTED naming %s or %s", n, msg, perClient, totalCap)
		}
	}
	if refused+total(open.Admitted) != floodStreams {
		t.Errorf("admitted %d + refused %d, want %d", total(open.Admitted), refused, floodStreams)
	}
	admitted := memory()

	// Publish, paced by the reader, until only the reader is subscribed.
	var published uint64
	first := bus.LastSequence() + 1
	for bus.Subscribers() > 1 {
		if published >= floodMax {
			t.Fatalf("%d events published and %d flood streams are still subscribed", published, bus.Subscribers()-1)
		}
		for range floodBatch {
			bus.Publish(Observable(srcOrch, "test.flood", "wf", "", map[string]any{"pad": strings.Repeat("x", floodPad)}))
			published++
		}
		for range floodBatch {
			resp, err := reader.Recv()
			if err != nil {
				t.Fatalf("the reader, after %d events: %v", published, err)
			}
			if want := first; resp.GetEvent().GetSequence() != want || resp.GetDropped() != 0 {
				t.Fatalf("the reader got event %d (dropped %d); want %d", resp.GetEvent().GetSequence(), resp.GetDropped(), want)
			}
			first++
		}
	}
	// Every flood handler has returned (the reader's has not).
	ended := 0
	for ended < total(open.Admitted) {
		err := h.handlerEnded(t)
		if errors.Is(err, errs.ResourceExhausted) && strings.Contains(err.Error(), "did not keep up") {
			ended++
		} else if !strings.Contains(fmt.Sprint(err), "too many lifecycle subscriptions") {
			t.Fatalf("a flood stream ended with %v", err)
		}
	}
	after := memory()
	t.Logf("%d events of %d B published; heap in use: %s before the flood, %s with the flood admitted, %s once it was ended (%+d KiB, %d KiB per stream, %d KiB live; bound %d KiB)",
		published, floodPad, before, admitted, after, (int64(after.heap)-int64(before.heap))>>10,
		(int64(after.heap)-int64(before.heap))/int64(max(total(open.Admitted), 1))>>10,
		(int64(after.live)-int64(before.live))/int64(max(total(open.Admitted), 1))>>10, floodBound(published)>>10)

	// The flood's clients read what reached them.
	drained := child.drain(t)
	if drained.Drained != total(open.Admitted) || len(drained.Problems) > 0 {
		t.Errorf("drained %d streams of %d; problems: %v", drained.Drained, total(open.Admitted), drained.Problems)
	}
	if drained.Ends["ResourceExhausted"] != drained.Drained {
		t.Errorf("flood streams ended with %v; want ResourceExhausted for all", drained.Ends)
	}
	t.Logf("the flood's clients read %d events in all, %.1f per stream", drained.Events, float64(drained.Events)/float64(max(drained.Drained, 1)))
	bound := floodBound(published)
	if grew := int64(after.heap) - int64(before.heap); grew > bound {
		t.Errorf("the heap in use grew by %d KiB with %d unread streams; want less than %d KiB", grew>>10, total(open.Admitted), bound>>10)
	}
}

// floodBound bounds the growth of the heap in use by the flood, once
// every unread stream has been ended: for DefaultMaxStreams streams,
// what the server promises, whatever number the flood got. What stays
// is gRPC's: an ended stream whose client does not read keeps, until the
// client reads or its connection closes, the messages gRPC queued for
// it, at most its write quota of 64 KiB plus the message that went over
// it, each message with about 350 B of bookkeeping (its frame, header and
// buffer slice); and its state and trailer, a few KiB. With events of
// e = floodPad+60 B encoded: (64 KiB + e) x (1 + 350 B / e) + 8 KiB =
// 82 KiB live, and half as much again for the allocator's size classes
// and the spans the flood's garbage leaves partly used: 128 KiB per
// stream. The bus adds its ring of the events published (about 2 e
// each in memory), each connection its buffers (64 KiB allowed), and
// 4 MiB go to everything else. Handlers, senders and subscriber buffers
// are gone.
func floodBound(published uint64) int64 {
	return DefaultMaxStreams*128<<10 + int64(published)*2*(floodPad+60) + floodClients*64<<10 + 4<<20
}

// memStat is the heap in use, the live heap and the goroutine stacks.
type memStat struct{ heap, live, stack uint64 }

func (m memStat) String() string {
	return fmt.Sprintf("%d KiB (live %d KiB, stacks %d KiB)", m.heap>>10, m.live>>10, m.stack>>10)
}

// memory is measured after a full collection.
func memory() memStat {
	runtime.GC()
	runtime.GC() // and what the first one's finalizers and pools let go
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return memStat{m.HeapInuse, m.HeapAlloc, m.StackInuse}
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

type floodChild struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	lines []string
}

// startFlood runs this test binary as the flood's child process.
func startFlood(t *testing.T, addr string) *floodChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestUnreadSubscribersFlood$", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), floodEnv+"="+addr)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &floodChild{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	c.out.Buffer(nil, 16<<20)
	t.Cleanup(func() {
		_ = in.Close() // the child exits when its stdin closes
		if err := cmd.Wait(); err != nil {
			t.Errorf("the flood's process: %v; output:\n%s", err, strings.Join(c.lines, "\n"))
		}
	})
	return c
}

// report reads the child's next report.
func (c *floodChild) report(t *testing.T) floodReport {
	t.Helper()
	for c.out.Scan() {
		line := c.out.Text()
		if rest, ok := strings.CutPrefix(line, "REPORT "); ok {
			var r floodReport
			if err := json.Unmarshal([]byte(rest), &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
		c.lines = append(c.lines, line)
	}
	t.Fatalf("the flood's process ended without a report: %v; output:\n%s", c.out.Err(), strings.Join(c.lines, "\n"))
	return floodReport{}
}

func (c *floodChild) drain(t *testing.T) floodReport {
	t.Helper()
	if _, err := io.WriteString(c.in, "drain\n"); err != nil {
		t.Fatal(err)
	}
	return c.report(t)
}

// TestUnreadSubscribersFlood is the child process of
// TestUnreadSubscribersMemory; it does nothing in a normal run.
func TestUnreadSubscribersFlood(t *testing.T) {
	addr := os.Getenv(floodEnv)
	if addr == "" {
		t.Skip("the child process of TestUnreadSubscribersMemory")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type opened struct {
		client string
		stream grpc.ServerStreamingClient[lifecyclev1.SubscribeResponse]
	}
	var (
		mu      sync.Mutex
		streams []opened
		r       = floodReport{Admitted: map[string]int{}, Refused: map[string]int{}, Ends: map[string]int{}}
		address = regexp.MustCompile(`(address 127\.0\.1\.)\d+`)
		wg      sync.WaitGroup
	)
	for c := range floodClients {
		ip := fmt.Sprintf("127.0.1.%d", c+1)
		// grpc-go's smallest windows, fixed: the client holds 64 KiB of
		// each stream it does not read.
		conn, err := dialFrom(addr, ip, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		client := lifecyclev1.NewLifecycleServiceClient(conn)
		wg.Go(func() {
			for range floodStreams / floodClients {
				stream, err := client.Subscribe(ctx, &lifecyclev1.SubscribeRequest{})
				var md metadata.MD
				if err == nil {
					// Headers come once the stream is subscribed; a
					// refused stream ends without them.
					md, err = stream.Header()
				}
				mu.Lock()
				switch {
				case err != nil:
					r.OtherErrs = append(r.OtherErrs, err.Error())
				case md == nil:
					_, err := stream.Recv()
					st := status.Convert(err)
					r.Refused[st.Code().String()+": "+address.ReplaceAllString(st.Message(), "$1N")]++
				default:
					r.Admitted[ip]++
					streams = append(streams, opened{ip, stream})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	printReport(r)

	// Wait for the parent, then read every admitted stream to its end.
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return // the parent is gone
	}
	resume := regexp.MustCompile(`resubscribe with after_sequence=(\d+) to resume(?: \((\d+) if event \d+ reached you before this status\))?`)
	r = floodReport{Ends: map[string]int{}}
	for i, o := range streams {
		var seqs []uint64
		var err error
		for {
			var resp *lifecyclev1.SubscribeResponse
			if resp, err = o.stream.Recv(); err != nil {
				break
			}
			seqs = append(seqs, resp.GetEvent().GetSequence())
		}
		st := status.Convert(err)
		r.Drained++
		r.Events += len(seqs)
		r.Ends[st.Code().String()]++
		problem := func(format string, args ...any) {
			if len(r.Problems) < 5 {
				r.Problems = append(r.Problems, fmt.Sprintf("stream %d from %s: ", i, o.client)+fmt.Sprintf(format, args...))
			}
		}
		for j := 1; j < len(seqs); j++ {
			if seqs[j] != seqs[j-1]+1 {
				problem("events not contiguous: %d after %d", seqs[j], seqs[j-1])
				break
			}
		}
		m := resume.FindStringSubmatch(st.Message())
		if m == nil || !strings.Contains(st.Message(), "did not keep up") {
			problem("ended with %v %q", st.Code(), st.Message())
			continue
		}
		if len(seqs) == 0 {
			continue // the resume point is where it subscribed, which it cannot see
		}
		last := strconv.FormatUint(seqs[len(seqs)-1], 10)
		if m[1] != last && m[2] != last {
			problem("received up to %s, told to resume with %q", last, m[0])
		}
	}
	printReport(r)
}

func printReport(r floodReport) {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	fmt.Printf("REPORT %s\n", b)
}
