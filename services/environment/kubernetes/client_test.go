package kubernetes

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/client-go/rest"
)

// TestClientPodLogs: PodLogs reads GET .../pods/NAME/log?container=C, the
// request of client-go's GetLogs. (The real API server tests cover the
// other calls; without a kubelet it has no logs to serve.)
func TestClientPodLogs(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/api/v1/namespaces/ns/pods/neuron-inv-1-x7k2p/log" || r.URL.Query().Get("container") != containerName {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.String(), http.StatusNotFound)
			return
		}
		io.WriteString(w, "the log\n")
	}))
	defer srv.Close()
	c, err := NewClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := c.PodLogs(context.Background(), "ns", "neuron-inv-1-x7k2p", containerName)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil || string(b) != "the log\n" {
		t.Fatalf("log = %q, %v; want \"the log\\n\"", b, err)
	}
}
