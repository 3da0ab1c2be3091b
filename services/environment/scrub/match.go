package scrub

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
// The scanner (scan.go) runs it and merges overlapping matches.
type matcher struct {
	class  [256]uint8
	nclass int
	// delta[state*nclass+class] is the next state, as next*nclass (so a
	// step is one load and one add), with the sign bit set when a
	// pattern ends at next (or, for a keyword matcher, its mask is not
	// empty). The start state is 0. Everything else is indexed by state
	// (see id).
	delta []int32
	// out[state] is the length of the pattern ending at state, 0 if none.
	out []int32
	// dict[state] is the nearest state on the failure chain (excluding
	// state itself) whose out is set, or -1.
	dict []int32
	// mask[state] is the union of the masks of all patterns that end at
	// state; only set for a keyword matcher.
	mask []uint64
	// depth[state] is the length of the longest suffix of what was read
	// that some pattern continues: a match still to come began at most
	// depth bytes ago.
	depth []int32
	// back[state] and fwd[state], for a matcher of normalized forms, are
	// how many units before and after a match of the pattern ending at
	// state may hold escaped bytes of the secret (see absorbable).
	back, fwd []uint8
	// maxDepth is the largest depth, maxBack the largest back.
	maxDepth, maxBack int
}

// newMatcher compiles pats for find; it returns nil when pats has no
// non-empty string.
func newMatcher(pats []string) *matcher {
	return build(pats, nil, nil)
}

// extent is how far a match of a normalized form may be widened: back
// units before it and fwd units after it (see absorbable).
type extent struct{ back, fwd uint8 }

// newNormMatcher compiles normalized forms, ext[i] being the extent of
// pats[i]; it returns nil when pats has no non-empty string.
func newNormMatcher(pats []string, ext []extent) *matcher {
	return build(pats, nil, ext)
}

// newKeywordMatcher compiles lower-case ASCII keywords, keyword i standing
// for masks[i], for ascii-case-insensitive use with any.
func newKeywordMatcher(keywords []string, masks []uint64) *matcher {
	return build(keywords, masks, nil)
}

// build compiles pats. With masks (one per pattern), ASCII letters match
// case-insensitively (pats must be lower case) and the per-state masks
// for any are computed. With ext (one per pattern), each state records
// the largest extent of the patterns that end there.
func build(pats []string, masks []uint64, ext []extent) *matcher {
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
	if fold || ext != nil {
		// Normalized forms are lower case too, and the scanner gives
		// ASCII letters as they are.
		for b := 'A'; b <= 'Z'; b++ {
			m.class[b] = m.class[b+'a'-'A']
		}
	}
	n := m.nclass
	// At most one state per pattern byte, plus the root.
	states := 1
	for _, p := range pats {
		states += len(p)
	}
	m.out = make([]int32, 0, states)
	m.depth = make([]int32, 0, states)
	m.delta = make([]int32, 0, states*n)
	if ext != nil {
		m.back = make([]uint8, 0, states)
		m.fwd = make([]uint8, 0, states)
	}
	row := make([]int32, n) // an empty row: no transition yet
	for i := range row {
		row[i] = -1
	}
	newState := func(depth int32) int32 {
		s := int32(len(m.out))
		m.out = append(m.out, 0)
		m.depth = append(m.depth, depth)
		if ext != nil {
			m.back = append(m.back, 0)
			m.fwd = append(m.fwd, 0)
		}
		m.delta = append(m.delta, row...)
		return s
	}
	newState(0) // root
	for pi, p := range pats {
		if p == "" {
			continue
		}
		s := int32(0)
		for i := 0; i < len(p); i++ {
			c := int32(m.class[p[i]])
			next := m.delta[s*int32(n)+c]
			if next < 0 {
				next = newState(int32(i + 1))
				m.delta[s*int32(n)+c] = next
			}
			s = next
		}
		m.out[s] = int32(len(p))
		m.maxDepth = max(m.maxDepth, len(p))
		if ext != nil {
			m.back[s] = max(m.back[s], ext[pi].back)
			m.fwd[s] = max(m.fwd[s], ext[pi].fwd)
			m.maxBack = max(m.maxBack, int(ext[pi].back))
		}
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

	// A state with a child in the trie is a proper prefix of a pattern;
	// one without has nothing to continue, and its depth is that of the
	// nearest state on its failure chain that has.
	trieDepth := m.depth
	m.depth = make([]int32, len(m.out))
	hasChild := func(u int32) bool {
		for c := range n {
			if m.delta[u*int32(n)+int32(c)] > 0 {
				return true
			}
		}
		return false
	}
	setDepth := func(u, f int32) {
		if hasChild(u) {
			m.depth[u] = trieDepth[u]
		} else {
			m.depth[u] = m.depth[f]
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
		setDepth(t, 0)
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
			setDepth(v, fu)
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
	for i, t := range m.delta {
		v := t * int32(n)
		if m.out[t] > 0 || m.dict[t] >= 0 || (fold && m.mask[t] != 0) {
			v |= flag
		}
		m.delta[i] = v
	}
	return m
}

// flag marks a delta entry whose state has an output.
const flag = -1 << 31

// id returns the index of state st, as held in delta, in the per-state
// tables.
func (m *matcher) id(st int32) int32 { return (st &^ flag) / int32(m.nclass) }

// any returns the union of the masks of the keywords that occur in s.
func (m *matcher) any(s string) uint64 {
	if m == nil {
		return 0
	}
	var seen uint64
	state := int32(0)
	for i := 0; i < len(s); i++ {
		state = m.delta[state&^flag+int32(m.class[s[i]])]
		if state < 0 {
			seen |= m.mask[m.id(state)]
		}
	}
	return seen
}
