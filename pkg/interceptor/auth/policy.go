package auth

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Principal is an authenticated caller and what it may call.
type Principal struct {
	// Name identifies the caller in logs and audit records.
	Name string `json:"name"`
	// Tokens are bearer tokens that authenticate as this principal.
	Tokens []string `json:"tokens,omitempty"`
	// Allow lists method patterns: "*", "/pkg.Service/*" or a full method.
	Allow []string `json:"allow"`
}

// Allowed reports whether the principal may call fullMethod.
func (p *Principal) Allowed(fullMethod string) bool {
	for _, a := range p.Allow {
		switch {
		case a == "*", a == fullMethod:
			return true
		case strings.HasSuffix(a, "/*") && strings.HasPrefix(fullMethod, strings.TrimSuffix(a, "*")):
			return true
		}
	}
	return false
}

// Policy is the set of principals a server accepts.
type Policy struct {
	principals []*Principal
	byName     map[string]*Principal
	byToken    map[[sha256.Size]byte]*Principal
}

// NewPolicy checks the principals and indexes them. Names must be unique
// and non-empty, tokens unique and at least 16 characters, and every
// principal must allow something.
func NewPolicy(principals []Principal) (*Policy, error) {
	p := &Policy{byName: map[string]*Principal{}, byToken: map[[sha256.Size]byte]*Principal{}}
	for i := range principals {
		pr := principals[i]
		if pr.Name == "" {
			return nil, fmt.Errorf("principal %d: name is empty", i)
		}
		if _, dup := p.byName[pr.Name]; dup {
			return nil, fmt.Errorf("principal %q: listed twice", pr.Name)
		}
		if len(pr.Allow) == 0 {
			return nil, fmt.Errorf("principal %q: allow is empty; list methods or \"*\"", pr.Name)
		}
		for _, a := range pr.Allow {
			if a != "*" && !strings.HasPrefix(a, "/") {
				return nil, fmt.Errorf("principal %q: allow pattern %q must be \"*\" or start with \"/\"", pr.Name, a)
			}
		}
		for _, tok := range pr.Tokens {
			if len(tok) < 16 {
				return nil, fmt.Errorf("principal %q: a token is shorter than 16 characters", pr.Name)
			}
			h := sha256.Sum256([]byte(tok))
			if _, dup := p.byToken[h]; dup {
				return nil, fmt.Errorf("principal %q: a token is shared with another principal", pr.Name)
			}
			p.byToken[h] = &pr
		}
		p.byName[pr.Name] = &pr
		p.principals = append(p.principals, &pr)
	}
	if len(p.principals) == 0 {
		return nil, errors.New("policy has no principals")
	}
	return p, nil
}

// LoadPolicy reads a policy file (see the package doc for its format).
func LoadPolicy(path string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth policy: %w", err)
	}
	var f struct {
		Principals []Principal `json:"principals"`
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("auth policy %s: %w", path, err)
	}
	p, err := NewPolicy(f.Principals)
	if err != nil {
		return nil, fmt.Errorf("auth policy %s: %w", path, err)
	}
	return p, nil
}

// byBearer finds the principal of a token. Tokens are looked up by their
// SHA-256, so lookup timing says nothing about the tokens themselves.
func (p *Policy) byBearer(token string) *Principal {
	return p.byToken[sha256.Sum256([]byte(token))]
}
