package state

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/blevesearch/bleve/v2"
	bolt "go.etcd.io/bbolt"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// Snippets of hybrid search. Hybrid search fuses up to max(limit, 50)
// candidates of each ranking and returns limit of them: the candidate
// searches run without snippets (withoutSnippets), and the backend cuts
// snippets for the returned keys only (snippetBackend), as a keyword
// search would have (around the query's matched words) for the keys the
// keyword ranking held, and from the start of the value for the others.

type noSnippetsKey struct{}

// withoutSnippets marks ctx so that Search and VectorSearch leave
// SearchHit.Snippet empty (and skip the work of cutting it).
func withoutSnippets(ctx context.Context) context.Context {
	return context.WithValue(ctx, noSnippetsKey{}, true)
}

// snippetsWanted reports whether ctx's Search or VectorSearch should cut
// snippets.
func snippetsWanted(ctx context.Context) bool {
	return ctx.Value(noSnippetsKey{}) == nil
}

// snippetBackend is a backend that cuts snippets for chosen keys.
type snippetBackend interface {
	// snippets returns the snippet of each of keys of the scope that
	// still exists: for the keys in matched, around query's matches (as
	// Search would cut it), for the others from the start of the value.
	snippets(ctx context.Context, s *typesv1.Scope, query string, keys []string, matched map[string]bool) (map[string]string, error)
}

// snippets implements snippetBackend: the value's tokens that are query
// terms are the matches (as Search finds them).
func (m *Memory) snippets(ctx context.Context, s *typesv1.Scope, query string, keys []string, matched map[string]bool) (map[string]string, error) {
	enc, err := m.scopeOnly(ctx, s)
	if err != nil {
		return nil, err
	}
	terms := map[string]bool{}
	for _, t := range tokenize(query) {
		terms[t.term] = true
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errClosed
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		d, ok := m.docs[string(enc)+k]
		if !ok {
			continue
		}
		var spans []span
		if matched[k] {
			for _, t := range d.textTokens {
				if terms[t.term] {
					spans = append(spans, t.span)
				}
			}
		}
		out[k] = snippet(d.text, spans)
	}
	return out, nil
}

// snippets implements snippetBackend: bleve finds the matches of the
// matched keys (one search restricted to their documents, with match
// locations and the stored text); the other keys' values are read from
// bbolt.
func (b *Bolt) snippets(ctx context.Context, s *typesv1.Scope, query string, keys []string, matched map[string]bool) (map[string]string, error) {
	enc, err := b.scopeOnly(ctx, s)
	if err != nil {
		return nil, err
	}
	end, err := b.begin()
	if err != nil {
		return nil, err
	}
	defer end()
	out := make(map[string]string, len(keys))
	var ids []string
	for _, k := range keys {
		if matched[k] {
			ids = append(ids, base64.RawURLEncoding.EncodeToString(append(bytes.Clone(enc), k...)))
		}
	}
	if len(ids) > 0 {
		if err := b.index.snippets(ctx, enc, query, ids, out); err != nil {
			return nil, err
		}
	}
	err = b.db.View(func(tx *bolt.Tx) error {
		kv := tx.Bucket(bucketKV)
		for _, k := range keys {
			if _, ok := out[k]; ok {
				continue
			}
			rec := kv.Get(append(bytes.Clone(enc), k...))
			if rec == nil {
				continue
			}
			_, _, raw, err := decodeRecord(rec)
			if err != nil {
				return err
			}
			v, err := unmarshalValue(raw)
			if err != nil {
				return err
			}
			out[k] = snippet(valueText(v), nil)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// snippets cuts, into out, the snippets of the documents ids of scope enc
// that match query, around their matches.
func (s *searchIndex) snippets(ctx context.Context, enc []byte, query string, ids []string, out map[string]string) error {
	inText := bleve.NewMatchQuery(query)
	inText.SetField(fieldText)
	inKey := bleve.NewMatchQuery(query)
	inKey.SetField(fieldKey)
	q := bleve.NewConjunctionQuery(bleve.NewDocIDQuery(ids), bleve.NewDisjunctionQuery(inText, inKey))
	req := bleve.NewSearchRequestOptions(q, len(ids), 0, false)
	req.Fields = []string{fieldText}
	req.IncludeLocations = true
	res, err := s.idx.SearchInContext(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("search index: %w", err)
	}
	for _, h := range res.Hits {
		ck, err := base64.RawURLEncoding.DecodeString(h.ID)
		if err != nil || !strings.HasPrefix(string(ck), string(enc)) {
			return fmt.Errorf("search index: document %q is not in the scope: %w", h.ID, errs.Internal)
		}
		text, _ := h.Fields[fieldText].(string)
		out[string(ck[len(enc):])] = snippet(text, hitSpans(h.Locations[fieldText]))
	}
	return nil
}
