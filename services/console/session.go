package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"sync"
	"time"
)

// cookieName is the session cookie. The __Host- prefix makes the browser
// refuse it unless it is Secure, has Path=/ and no Domain: no subdomain
// can plant or overwrite it.
const cookieName = "__Host-neuron-console"

// session is one login: the bearer token every call of it carries, and
// the CSRF token its state-changing requests must echo. The token never
// leaves the server after the login form posted it.
type session struct {
	id      string
	token   string
	csrf    string
	expires time.Time

	mu  sync.Mutex
	can map[string]bool // what the services allow its principal (probe.go)
}

// allowed is can[name], true when it is not known (the services decide).
func (s *session) allowed(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.can[name]
	return !ok || v
}

// setCan records what a call learned about the principal's permission.
func (s *session) setCan(name string, v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.can == nil {
		s.can = map[string]bool{}
	}
	s.can[name] = v
}

// caps is a copy of can.
func (s *session) caps() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]bool, len(s.can))
	for k, v := range s.can {
		out[k] = v
	}
	return out
}

// checkCSRF reports whether tok is the session's CSRF token.
func (s *session) checkCSRF(tok string) bool {
	return tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.csrf)) == 1
}

// sessions is the server-side session store: in memory, so a restart of
// the console logs everyone out (the services hold all other state).
type sessions struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu   sync.Mutex
	byID map[string]*session
}

func newSessions(ttl time.Duration, max int) *sessions {
	if ttl <= 0 {
		ttl = DefaultSessionTTL
	}
	if max <= 0 {
		max = DefaultMaxSessions
	}
	return &sessions{ttl: ttl, max: max, now: time.Now, byID: map[string]*session{}}
}

// randomToken is 32 random bytes, base64url.
func randomToken() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("crypto/rand: " + err.Error()) // never fails on Linux
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// create starts a session acting with token.
func (ss *sessions) create(token string, can map[string]bool) *session {
	s := &session{id: randomToken(), token: token, csrf: randomToken(), expires: ss.now().Add(ss.ttl), can: can}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	now := ss.now()
	for id, o := range ss.byID {
		if now.After(o.expires) {
			delete(ss.byID, id)
		}
	}
	for len(ss.byID) >= ss.max {
		var oldest *session
		for _, o := range ss.byID {
			if oldest == nil || o.expires.Before(oldest.expires) {
				oldest = o
			}
		}
		delete(ss.byID, oldest.id)
	}
	ss.byID[s.id] = s
	return s
}

// get is the live session of id, or nil.
func (ss *sessions) get(id string) *session {
	if id == "" {
		return nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.byID[id]
	if s == nil {
		return nil
	}
	if ss.now().After(s.expires) {
		delete(ss.byID, id)
		return nil
	}
	return s
}

// drop ends a session.
func (ss *sessions) drop(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.byID, id)
}

// cookie is the session cookie of s (or one that clears it, for nil).
func (ss *sessions) cookie(s *session) *http.Cookie {
	c := &http.Cookie{Name: cookieName, Path: "/", Secure: true, HttpOnly: true, SameSite: http.SameSiteStrictMode}
	if s == nil {
		c.MaxAge = -1
		return c
	}
	c.Value = s.id
	c.MaxAge = int(ss.ttl / time.Second)
	return c
}
