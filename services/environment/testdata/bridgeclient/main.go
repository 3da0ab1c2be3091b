// Command bridgeclient is run by the bridge attack tests inside an
// invocation's sandbox, through the operator's bash tool: it attacks the
// invocation's state bridge socket and prints what it got, compactly
// (the scripted model quotes only the first 200 characters of a tool
// result).
//
//	bridgeclient SOCKET scopes OWN_SESSION OTHER_SESSION
//	bridgeclient SOCKET flood SECONDS
//
// scopes reads, lists and searches other scopes and prints each answer's
// gRPC code as a number (7 is PERMISSION_DENIED), or "0:" and the value
// when a read succeeds, then reads OWN_SESSION's key "notes/own" (which
// shows that the socket was reachable at all).
//
// flood creates the file flood-started in the working directory, opens
// connections to the socket for SECONDS, holding up to 900 at once, and
// prints how many it opened and how many the bridge still held open at
// the end.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/scope"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: bridgeclient SOCKET scopes OWN OTHER | bridgeclient SOCKET flood SECONDS")
		os.Exit(2)
	}
	sock, mode := os.Args[1], os.Args[2]
	switch {
	case mode == "scopes" && len(os.Args) == 5:
		scopes(sock, os.Args[3], os.Args[4])
	case mode == "flood" && len(os.Args) == 4:
		secs, err := strconv.Atoi(os.Args[3])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		flood(sock, time.Duration(secs)*time.Second)
	default:
		fmt.Fprintln(os.Stderr, "bad arguments")
		os.Exit(2)
	}
}

func scopes(sock, own, other string) {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	defer conn.Close()
	c := statev1.NewStateServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	read := func(s *typesv1.Scope, key string) string {
		r, err := c.Read(ctx, &statev1.ReadRequest{Scope: s, Key: key})
		if err != nil {
			return strconv.Itoa(int(status.Code(err)))
		}
		return "0:" + r.GetValue().GetStringValue()
	}
	list := func(s *typesv1.Scope) string {
		r, err := c.List(ctx, &statev1.ListRequest{Scope: s})
		if err != nil {
			return strconv.Itoa(int(status.Code(err)))
		}
		var keys []string
		for _, it := range r.GetItems() {
			keys = append(keys, it.GetKey())
		}
		return "0:" + strings.Join(keys, ",")
	}
	search := func(s *typesv1.Scope) string {
		r, err := c.Search(ctx, &statev1.SearchRequest{Scope: s, Query: "secret"})
		if err != nil {
			return strconv.Itoa(int(status.Code(err)))
		}
		var snips []string
		for _, it := range r.GetResults() {
			snips = append(snips, it.GetSnippet())
		}
		return "0:" + strings.Join(snips, ",")
	}
	out := []string{
		"rB=" + read(scope.Session(other), "notes/secret"),
		"rG=" + read(scope.Global(), "notes/secret"),
		"lB=" + list(scope.Session(other)),
		"sB=" + search(scope.Session(other)),
		"sG=" + search(scope.Global()),
		"rC=" + read(scope.Custom(own), "notes/secret"),
		"rN=" + read(nil, "notes/secret"),
		"own=" + read(scope.Session(own), "notes/own"),
	}
	fmt.Println(strings.Join(out, " "))
}

func flood(sock string, d time.Duration) {
	const hold = 900
	var (
		held           []net.Conn
		dialed, failed int
	)
	_ = os.WriteFile("flood-started", nil, 0o644)
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			failed++
			time.Sleep(time.Millisecond)
			continue
		}
		dialed++
		held = append(held, c)
		if len(held) >= hold {
			held[0].Close()
			held = held[1:]
		}
	}
	// A connection the bridge closed reads EOF at once (after what the
	// server wrote first, if anything); one it still holds times out.
	var open atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(500 * time.Millisecond)
	for _, c := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(end)
			var b [512]byte
			for {
				_, err := c.Read(b[:])
				if errors.Is(err, os.ErrDeadlineExceeded) {
					open.Add(1)
				}
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	fmt.Printf("dialed=%d failed=%d open=%d\n", dialed, failed, open.Load())
}
