package openairesponses

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"

	"github.com/secbear/neuron/services/operator/provider"
)

// DefaultMaxSessions is how many sessions' chains are remembered when
// Config.MaxSessions is 0.
const DefaultMaxSessions = 10_000

// chain is what is remembered of a session: the last response stored by
// the API, and the conversation prefix it covers.
type chain struct {
	// responseID is the stored response to continue from.
	responseID string
	// covered is how many of the session's messages the stored response
	// covers: the request's messages plus the assistant message holding
	// the response itself.
	covered int
	// hash is prefixHash of those covered messages.
	hash [sha256.Size]byte
}

// sessions is a bounded, least-recently-used map from session id to chain,
// safe for concurrent use.
type sessions struct {
	mu    sync.Mutex
	max   int
	order *list.List // of *sessionEntry, most recently used first
	byID  map[string]*list.Element
}

type sessionEntry struct {
	id    string
	chain chain
}

func newSessions(max int) *sessions {
	return &sessions{max: max, order: list.New(), byID: make(map[string]*list.Element)}
}

// get returns the chain of session id and marks it recently used.
func (s *sessions) get(id string) (chain, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.byID[id]
	if !ok {
		return chain{}, false
	}
	s.order.MoveToFront(el)
	return el.Value.(*sessionEntry).chain, true
}

// put records the chain of session id, evicting the least recently used
// session when full.
func (s *sessions) put(id string, c chain) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.byID[id]; ok {
		el.Value.(*sessionEntry).chain = c
		s.order.MoveToFront(el)
		return
	}
	s.byID[id] = s.order.PushFront(&sessionEntry{id: id, chain: c})
	for s.order.Len() > s.max {
		last := s.order.Back()
		s.order.Remove(last)
		delete(s.byID, last.Value.(*sessionEntry).id)
	}
}

// drop forgets session id.
func (s *sessions) drop(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.byID[id]; ok {
		s.order.Remove(el)
		delete(s.byID, id)
	}
}

// len is the number of sessions remembered.
func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.order.Len()
}

// prefixHash is a SHA-256 over a canonical, unambiguous encoding of msgs
// (every field length-prefixed), so two message lists hash alike exactly
// when they are equal.
func prefixHash(msgs ...[]provider.Message) [sha256.Size]byte {
	h := sha256.New()
	for _, list := range msgs {
		for _, m := range list {
			hashMessage(h, m)
		}
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

func hashMessage(h hash.Hash, m provider.Message) {
	writeUint(h, uint64(m.Role))
	writeUint(h, uint64(len(m.Parts)))
	for _, p := range m.Parts {
		switch {
		case p.ToolUse != nil:
			writeBytes(h, []byte{'u'})
			writeBytes(h, []byte(p.ToolUse.ID))
			writeBytes(h, []byte(p.ToolUse.Name))
			writeBytes(h, p.ToolUse.Input)
		case p.ToolResult != nil:
			writeBytes(h, []byte{'r'})
			writeBytes(h, []byte(p.ToolResult.ToolUseID))
			writeBytes(h, []byte(p.ToolResult.Content))
			if p.ToolResult.IsError {
				writeUint(h, 1)
			} else {
				writeUint(h, 0)
			}
		case p.Image != nil:
			writeBytes(h, []byte{'i'})
			writeBytes(h, p.Image.Data)
			writeBytes(h, []byte(p.Image.URL))
			writeBytes(h, []byte(p.Image.MediaType))
		default:
			writeBytes(h, []byte{'t'})
			writeBytes(h, []byte(p.Text))
		}
	}
}

func writeUint(h hash.Hash, v uint64) {
	var buf [binary.MaxVarintLen64]byte
	h.Write(buf[:binary.PutUvarint(buf[:], v)])
}

func writeBytes(h hash.Hash, b []byte) {
	writeUint(h, uint64(len(b)))
	h.Write(b)
}
