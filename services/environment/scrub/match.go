package scrub

import (
	"cmp"
	"slices"
)

// span is a half-open byte range [start, end) of a match.
type span struct{ start, end int }

// matcher finds many exact byte strings in one pass with an Aho–Corasick
// automaton compiled to a dense transition table.
//
// The input alphabet is compressed to the bytes that occur in some
// pattern plus one class for every other byte, so the table stays small
// (states × classes) even for many secrets with all their encodings.
// A scan costs two table loads per input byte whatever the number of
// patterns, and allocates nothing when there is no match.
//
// Overlapping matches are merged into one span covering all of them, so
// a secret that is a prefix of (or overlaps) another is never split from
// it and no part of either is left behind. Adjacent matches stay
// separate.
type matcher struct {
	class  [256]uint8
	nclass int
	// delta[state*nclass+class] is the next state.
	delta []int32
	// out[state] is the length of the pattern ending at state, 0 if none.
	out []int32
	// dict[state] is the nearest state on the failure chain (excluding
	// state itself) whose out is set, or -1.
	dict []int32
	// mask[state] is the union of the masks of all patterns that end at
	// state; only set for a keyword matcher.
	mask []uint64
}

// newMatcher compiles pats for find; it returns nil when pats has no
// non-empty string.
func newMatcher(pats []string) *matcher {
	return build(pats, nil)
}

// newKeywordMatcher compiles lower-case ASCII keywords, keyword i standing
// for masks[i], for ascii-case-insensitive use with any.
func newKeywordMatcher(keywords []string, masks []uint64) *matcher {
	return build(keywords, masks)
}

// build compiles pats. With masks (one per pattern), ASCII letters match
// case-insensitively (pats must be lower case) and the per-state masks
// for any are computed.
func build(pats []string, masks []uint64) *matcher {
	m := &matcher{}
	fold := masks != nil
	var used [256]bool
	for _, p := range pats {
		for i := 0; i < len(p); i++ {
			used[p[i]] = true
		}
	}
	m.nclass = 1 // class 0: bytes in no pattern
	for b := range 256 {
		if used[b] && !(fold && 'A' <= b && b <= 'Z') {
			m.class[b] = uint8(m.nclass)
			m.nclass++
		}
	}
	if m.nclass == 1 {
		return nil
	}
	if fold {
		for b := 'A'; b <= 'Z'; b++ {
			m.class[b] = m.class[b+'a'-'A']
		}
	}
	n := m.nclass
	newState := func() int32 {
		s := int32(len(m.out))
		m.out = append(m.out, 0)
		for range n {
			m.delta = append(m.delta, -1)
		}
		return s
	}
	newState() // root
	for pi, p := range pats {
		if p == "" {
			continue
		}
		s := int32(0)
		for i := 0; i < len(p); i++ {
			c := int32(m.class[p[i]])
			next := m.delta[s*int32(n)+c]
			if next < 0 {
				next = newState()
				m.delta[s*int32(n)+c] = next
			}
			s = next
		}
		m.out[s] = int32(len(p))
		if fold {
			for len(m.mask) < len(m.out) {
				m.mask = append(m.mask, 0)
			}
			m.mask[s] |= masks[pi]
		}
	}
	if fold {
		for len(m.mask) < len(m.out) {
			m.mask = append(m.mask, 0)
		}
	}

	// Breadth-first: fill the missing transitions from the failure
	// links so delta becomes a complete automaton.
	fail := make([]int32, len(m.out))
	m.dict = make([]int32, len(m.out))
	m.dict[0] = -1
	queue := make([]int32, 0, len(m.out))
	for c := range n {
		t := m.delta[c]
		if t < 0 {
			m.delta[c] = 0
			continue
		}
		fail[t] = 0
		m.dict[t] = -1
		queue = append(queue, t)
	}
	for len(queue) > 0 {
		u := queue[0]
		queue = queue[1:]
		for c := range n {
			i := u*int32(n) + int32(c)
			v := m.delta[i]
			fu := m.delta[fail[u]*int32(n)+int32(c)]
			if v < 0 {
				m.delta[i] = fu
				continue
			}
			fail[v] = fu
			if fold {
				// fu is shallower than v, so its mask is complete.
				m.mask[v] |= m.mask[fu]
			}
			if m.out[fu] > 0 {
				m.dict[v] = fu
			} else {
				m.dict[v] = m.dict[fu]
			}
			queue = append(queue, v)
		}
	}
	return m
}

// find returns the spans of s covered by matches, overlapping matches
// merged, in order, or nil.
func (m *matcher) find(s string) []span {
	if m == nil {
		return nil
	}
	var all []span
	n := int32(m.nclass)
	state := int32(0)
	for i := 0; i < len(s); i++ {
		state = m.delta[state*n+int32(m.class[s[i]])]
		t := state
		if m.out[t] == 0 {
			t = m.dict[t]
		}
		for ; t >= 0; t = m.dict[t] {
			all = append(all, span{i + 1 - int(m.out[t]), i + 1})
		}
	}
	if len(all) == 0 {
		return nil
	}
	slices.SortFunc(all, func(a, b span) int {
		if c := cmp.Compare(a.start, b.start); c != 0 {
			return c
		}
		return cmp.Compare(b.end, a.end)
	})
	merged := all[:1]
	for _, sp := range all[1:] {
		last := &merged[len(merged)-1]
		if sp.start < last.end {
			last.end = max(last.end, sp.end)
			continue
		}
		merged = append(merged, sp)
	}
	return merged
}

// any returns the union of the masks of the keywords that occur in s.
func (m *matcher) any(s string) uint64 {
	if m == nil {
		return 0
	}
	var seen uint64
	n := int32(m.nclass)
	state := int32(0)
	for i := 0; i < len(s); i++ {
		state = m.delta[state*n+int32(m.class[s[i]])]
		seen |= m.mask[state]
	}
	return seen
}
