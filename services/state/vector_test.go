package state

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/embed"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// keywordOnly hides a backend's vector search, as a backend without a
// vector index (the postgres one) is seen by the Server.
type keywordOnly struct{ Backend }

// failingEmbedder fails every call, as an unreachable provider does.
type failingEmbedder struct{}

func (failingEmbedder) Name() string { return "failing" }
func (failingEmbedder) Embed(context.Context, []string, embed.Purpose) ([][]float32, error) {
	return nil, errors.New("connection refused: " + errs.Unavailable.Error())
}

func vectorSearch(query string) *statev1.SearchRequest {
	return &statev1.SearchRequest{Scope: scope.Session("s"), Query: query, Mode: statev1.SearchMode_SEARCH_MODE_VECTOR}
}

// TestServerEmbedder: what the Server does with and without an embedder
// and a vector backend, through Run.
func TestServerEmbedder(t *testing.T) {
	ctx := t.Context()
	sc := scope.Session("s")
	write := func(c statev1.StateServiceClient, key, text string, mode statev1.EmbedMode) error {
		_, err := c.Write(ctx, &statev1.WriteRequest{Scope: sc, Key: key, Value: structpb.NewStringValue(text), Embed: mode})
		return err
	}

	t.Run("none", func(t *testing.T) {
		c := serveRun(t, Config{Backend: BackendMemory})
		_, err := c.Search(ctx, vectorSearch("car"))
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--embedder") {
			t.Errorf("vector search without an embedder: %v; want FAILED_PRECONDITION naming --embedder", err)
		}
		if err := write(c, "k", "v", statev1.EmbedMode_EMBED_MODE_ALWAYS); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("embed ALWAYS without an embedder: %v; want FAILED_PRECONDITION", err)
		}
		if err := write(c, "k", "v", statev1.EmbedMode_EMBED_MODE_UNSPECIFIED); err != nil {
			t.Errorf("a plain write: %v", err)
		}
	})

	t.Run("keyword-only backend", func(t *testing.T) {
		c := serveRun(t, Config{Store: keywordOnly{NewMemory()}, Embedder: embed.Test{}})
		_, err := c.Search(ctx, vectorSearch("car"))
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("vector search: %v; want UNIMPLEMENTED", err)
		}
		_, err = c.Write(ctx, &statev1.WriteRequest{Scope: sc, Key: "k", Value: structpb.NewStringValue("v"), Embedding: []float32{1}})
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("a write with an embedding: %v; want UNIMPLEMENTED", err)
		}
		if err := write(c, "k", "v", statev1.EmbedMode_EMBED_MODE_UNSPECIFIED); err != nil {
			t.Errorf("a plain write: %v (the embedder must not be asked)", err)
		}
	})

	t.Run("embed writes off", func(t *testing.T) {
		c := serveRun(t, Config{Backend: BackendMemory, Embedder: embed.Test{}, NoEmbedWrites: true})
		if err := write(c, "plain", "my car is blue", statev1.EmbedMode_EMBED_MODE_UNSPECIFIED); err != nil {
			t.Fatal(err)
		}
		if err := write(c, "asked", "the automobile is azure", statev1.EmbedMode_EMBED_MODE_ALWAYS); err != nil {
			t.Fatal(err)
		}
		res, err := c.Search(ctx, vectorSearch("vehicle colour"))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.GetResults()) != 1 || res.GetResults()[0].GetKey() != "asked" {
			t.Errorf("vector search = %v; want only the write that asked to be embedded", res.GetResults())
		}
	})

	t.Run("failing embedder", func(t *testing.T) {
		c := serveRun(t, Config{Backend: BackendMemory, Embedder: failingEmbedder{}})
		if err := write(c, "k", "my car is blue", statev1.EmbedMode_EMBED_MODE_UNSPECIFIED); err != nil {
			t.Errorf("a write that did not ask for an embedding: %v; want it written without one", err)
		}
		if _, err := c.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: "k"}); err != nil {
			t.Errorf("read back: %v", err)
		}
		if err := write(c, "k2", "v", statev1.EmbedMode_EMBED_MODE_ALWAYS); status.Code(err) == codes.OK {
			t.Error("embed ALWAYS with a failing embedder succeeded; want the embedder's error")
		}
		if _, err := c.Read(ctx, &statev1.ReadRequest{Scope: sc, Key: "k2"}); status.Code(err) != codes.NotFound {
			t.Errorf("after a failed embed ALWAYS: %v; want nothing written", err)
		}
		if _, err := c.Search(ctx, vectorSearch("car")); status.Code(err) == codes.OK {
			t.Error("vector search with a failing embedder succeeded")
		}
	})
}

// TestBoltVectorsAfterCrash: the vector index is rebuilt from the file
// when the process dies before the index caught up (here: the indexes are
// dropped without the catch-up Close does), and an older file is
// upgraded to the vectors bucket.
func TestBoltVectorsAfterCrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	b, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, sc := t.Context(), scope.Session("s")
	put := func(b *Bolt, key, text string) {
		t.Helper()
		if _, err := b.Write(ctx, sc, key, structpb.NewStringValue(text), Guard{Embedding: embed.TestVector(text)}); err != nil {
			t.Fatal(err)
		}
	}
	put(b, "car", "my car is blue")
	put(b, "dog", "the dog is called Rex")
	put(b, "gone", "my dog likes coffee")
	if _, err := b.Delete(ctx, sc, "gone", Guard{}); err != nil {
		t.Fatal(err)
	}
	put(b, "car", "my cat is red") // re-embedded
	// Crash: stop without catching up or persisting the indexes.
	b.index.stopIndexer()
	_ = b.index.idx.Close()
	_ = b.db.Close()

	b, err = OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	hits, err := b.VectorSearch(ctx, sc, embed.TestVector("puppy"), 10)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, h := range hits {
		keys = append(keys, h.Key)
	}
	if !slices.Equal(keys, []string{"dog", "car"}) || hits[0].Score < 0.5 || hits[1].Score > 0.1 {
		t.Fatalf("after the crash: %v; want dog (similar), then car (re-embedded as a cat), not the deleted key", hits)
	}
	if n := b.index.vectors.size(); n != 2 {
		t.Errorf("vector index holds %d vectors; want 2", n)
	}
}
