package scrub

// scanner finds the exact forms of the secrets in a text that may arrive
// in pieces: the raw forms byte by byte with one automaton, the
// normalized forms unit by unit (see normalize.go) with another, in the
// same pass. Matches of both become spans of the input, overlapping ones
// merged. It is linear in the input: a constant amount of work per byte
// plus one step per match.
//
// For the Writer it also says how far the input is final (safe): no
// match still to come can reach before that offset.
type scanner struct {
	raw, norm *matcher
	// rs and ns are the automata's states.
	rs, ns int32
	// rpos is the offset of the next byte the raw automaton reads, pos
	// that of the next byte the normalizer reads (behind rpos while an
	// escape is cut by the end of the input so far).
	rpos, pos int
	// units is the number of units read; ring holds the last len(ring)
	// of them (a power of two).
	units int
	ring  []unitRec
	mask  int
	// gap is the number of separator bytes since the last unit.
	gap int
	// pendingEsc is the offset of the first escape read since the last
	// unit, or -1.
	pendingEsc int
	// spans are the merged matches not yet taken, in order.
	spans []span
	// ext are matches whose end may still widen.
	ext []widen
	// taken counts the spans taken; floor is the offset up to which the
	// input was taken.
	taken, floor int
}

// unitRec is a unit read: the bytes of the input it came from, and the
// offset of the first escape read since the previous unit (its own
// token included), or -1.
type unitRec struct {
	start, end int
	esc        int
}

// widen is a match of a form whose last fwd units may have been read
// into an escape with the bytes after it: it is widened over any escape
// read before unit last+fwd.
type widen struct {
	start int // the match's first byte
	last  int // the index of its last unit
	fwd   int
}

func newScanner(raw, norm *matcher) *scanner {
	s := &scanner{raw: raw, norm: norm, pendingEsc: -1}
	if norm != nil {
		n := 1
		for n < norm.maxDepth+norm.maxBack+2 {
			n <<= 1
		}
		s.ring = make([]unitRec, n)
		s.mask = n - 1
	}
	return s
}

func (s *scanner) reset() {
	s.rs, s.ns, s.rpos, s.pos, s.units, s.gap, s.taken, s.floor = 0, 0, 0, 0, 0, 0, 0, 0
	s.pendingEsc = -1
	s.spans = s.spans[:0]
	s.ext = s.ext[:0]
}

// feed reads data, which holds the input from offset base on: the raw
// automaton all of it, the normalizer as far as it can (all of it when
// final, else up to an escape or a rune that the end of data cuts).
func feed[T text](s *scanner, data T, base int, final bool) {
	end := base + len(data)
	if raw := s.raw; raw != nil {
		st, delta, class := s.rs, raw.delta, &raw.class
		for p := s.rpos; p < end; p++ {
			st = delta[st&^flag+int32(class[data[p-base]])]
			if st < 0 {
				s.rawMatch(st, p+1)
			}
		}
		s.rs = st
	}
	s.rpos = end
	norm := s.norm
	if norm == nil {
		s.pos = end
		return
	}
	delta, class := norm.delta, &norm.class
	for s.pos < end {
		// The common cases in a tight loop: ASCII letters, digits and
		// separators, with no escape pending.
		if s.pendingEsc < 0 && len(s.ext) == 0 {
			pos, ns, units, gap := s.pos, s.ns&^flag, s.units, s.gap
			ring, mask := s.ring, s.mask
			for pos < end {
				c := data[pos-base]
				k := byteKind[c]
				if k == kindLit {
					v := delta[ns+int32(class[c])]
					ring[units&mask] = unitRec{pos, pos + 1, -1}
					units++
					pos++
					gap = 0
					ns = v &^ flag
					if v < 0 {
						s.pos, s.ns, s.units, s.gap = pos, v, units, gap
						s.normMatch(v, units-1)
						if len(s.ext) > 0 {
							break
						}
					}
					continue
				}
				if k != kindSep {
					break
				}
				pos++
				if gap++; gap > maxGap {
					ns = 0 // too far apart to be one value
				}
			}
			s.pos, s.ns, s.units, s.gap = pos, ns, units, gap
			if pos == end {
				return
			}
		}
		// One token the slow way.
		i := s.pos - base
		switch c := data[i]; byteKind[c] {
		case kindLit:
			s.unit(c, s.pos, s.pos+1)
			s.pos++
			continue
		case kindSep:
			s.separator(1)
			s.pos++
			continue
		case kindPad:
			// Padding right after a match is part of it.
			if n := len(s.spans); n > 0 && s.spans[n-1].end == s.pos {
				s.spans[n-1].end++
			}
			s.separator(1)
			s.pos++
			continue
		}
		t, wait := next(data, i, final)
		if wait {
			return
		}
		start := s.pos
		if t.esc {
			s.escape(start + t.n)
		}
		if t.nu == 0 {
			if t.esc && s.pendingEsc < 0 {
				s.pendingEsc = start
			}
			s.separator(t.n)
		}
		for j := range t.nu {
			if t.esc && s.pendingEsc < 0 {
				s.pendingEsc = start // each unit of the escape
			}
			s.unit(t.u[j], start, start+t.n)
		}
		s.pos += t.n
	}
}

// unit reads one unit that came from input[start:end].
func (s *scanner) unit(b byte, start, end int) {
	m := s.norm
	s.gap = 0
	st := m.delta[s.ns&^flag+int32(m.class[b])]
	s.ns = st
	u := s.units
	s.ring[u&s.mask] = unitRec{start, end, s.pendingEsc}
	s.pendingEsc = -1
	s.units++
	if len(s.ext) > 0 {
		s.expire()
	}
	if st < 0 {
		s.normMatch(st, u)
	}
}

// separator reads n separator bytes.
func (s *scanner) separator(n int) {
	s.gap += n
	if s.gap > maxGap {
		s.ns = 0 // too far apart to be one value
	}
}

// escape widens the matches waiting for one over an escape ending at
// end.
func (s *scanner) escape(end int) {
	for _, w := range s.ext {
		if s.units > w.last && s.units <= w.last+w.fwd {
			s.add(span{w.start, end})
		}
	}
}

// expire drops the widenings whose units have all been read.
func (s *scanner) expire() {
	keep := s.ext[:0]
	for _, w := range s.ext {
		if s.units <= w.last+w.fwd {
			keep = append(keep, w)
		}
	}
	s.ext = keep
}

// rawMatch records the raw forms that end at state st, before offset end.
func (s *scanner) rawMatch(st int32, end int) {
	m := s.raw
	st = m.id(st)
	if m.out[st] == 0 {
		st = m.dict[st]
	}
	for ; st >= 0; st = m.dict[st] {
		s.add(span{end - int(m.out[st]), end})
	}
}

// normMatch records the normalized forms that end at state st, with
// unit u.
func (s *scanner) normMatch(st int32, u int) {
	m := s.norm
	st = m.id(st)
	if m.out[st] == 0 {
		st = m.dict[st]
	}
	for ; st >= 0; st = m.dict[st] {
		first := u - int(m.out[st]) + 1
		sp := span{s.ring[first&s.mask].start, s.ring[u&s.mask].end}
		if back := int(m.back[st]); back > 0 {
			// Escapes among the units before the match, or just
			// before its first unit, may hold its first bytes.
			for k := max(first-back, s.units-len(s.ring), 0); k <= first; k++ {
				if e := s.ring[k&s.mask].esc; e >= 0 && e < sp.start {
					sp.start = e
				}
			}
		}
		s.add(sp)
		if fwd := int(m.fwd[st]); fwd > 0 {
			s.ext = append(s.ext, widen{sp.start, u, fwd})
		}
	}
}

// add records sp, merging it with the spans it overlaps. Adjacent spans
// stay separate.
func (s *scanner) add(sp span) {
	if sp.end <= s.floor {
		return
	}
	sp.start = max(sp.start, s.floor)
	j := len(s.spans)
	for j > 0 && s.spans[j-1].end > sp.start {
		j--
	}
	k := j
	for k < len(s.spans) && s.spans[k].start < sp.end {
		sp.start = min(sp.start, s.spans[k].start)
		sp.end = max(sp.end, s.spans[k].end)
		k++
	}
	if j == k {
		s.spans = append(s.spans, span{})
		copy(s.spans[j+1:], s.spans[j:])
		s.spans[j] = sp
		return
	}
	s.spans[j] = sp
	s.spans = append(s.spans[:j+1], s.spans[k:]...)
}

// safe returns the offset up to which the input read can be released:
// no match still to come covers a byte before it that is not already
// covered. A match still to come begins at an offset some automaton
// still tracks, or (widened back) at an escape shortly before a unit
// the normalizer still tracks; such bytes are held unless a span already
// covers them. Spans are released whole, and a later match that overlaps
// released text is clipped to what follows it.
func (s *scanner) safe() int {
	safe := s.pos
	if m := s.raw; m != nil {
		for b := s.rpos - int(m.depth[m.id(s.rs)]); b < s.rpos; b++ {
			if !s.covered(b, b+1) {
				safe = min(safe, b)
				break
			}
		}
	}
	if m := s.norm; m != nil {
		first := s.units - int(m.depth[m.id(s.ns)])
		for k := first; k < s.units; k++ {
			if u := s.ring[k&s.mask]; !s.covered(u.start, u.end) {
				safe = min(safe, u.start)
				break
			}
		}
		if m.maxBack > 0 {
			// Escapes are held even when covered: the match widened
			// over one may reach past the span that covers it.
			for k := max(first-m.maxBack, s.units-len(s.ring), 0); k < s.units; k++ {
				if e := s.ring[k&s.mask].esc; e >= s.floor {
					safe = min(safe, e)
					break
				}
			}
			if s.pendingEsc >= s.floor {
				safe = min(safe, s.pendingEsc)
			}
		}
	}
	for _, sp := range s.spans {
		// A span that reaches past safe may still grow, and so may one
		// that ends where reading stopped (by padding).
		if sp.end > safe || sp.end == s.pos {
			safe = min(safe, sp.start)
			break
		}
	}
	return safe
}

// covered reports whether the bytes [start, end) were released or are
// in one span.
func (s *scanner) covered(start, end int) bool {
	if end <= s.floor {
		return true
	}
	start = max(start, s.floor)
	for i := len(s.spans) - 1; i >= 0; i-- {
		if sp := s.spans[i]; sp.start <= start {
			return end <= sp.end
		}
	}
	return false
}

// take appends data[:upto-base], with the spans before upto replaced by
// Redacted, to out, and forgets those spans. data holds the input from
// offset base on; no span may begin before base.
func take[T text](s *scanner, out []byte, data T, base, upto int) []byte {
	last := base
	n := 0
	for _, sp := range s.spans {
		if sp.end > upto {
			break
		}
		out = append(out, data[last-base:sp.start-base]...)
		out = append(out, Redacted...)
		last = sp.end
		n++
	}
	s.spans = append(s.spans[:0], s.spans[n:]...)
	s.taken += n
	s.floor = upto
	return append(out, data[last-base:upto-base]...)
}
