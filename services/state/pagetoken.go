package state

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"

	"github.com/secbear/neuron/pkg/errs"
)

// Page tokens are opaque to clients. Inside, a token is
//
//	version(1) | sha256(scope)[:16] | sha256(prefix)[:16] | last key | hmac(32)
//
// (version 1 continues an ascending listing, 2 a reversed one)
// base64url-encoded without padding (and only so: a token that is not
// exactly the encoding of its bytes, e.g. with a line break inserted, is
// malformed), where hmac is HMAC-SHA256 under a secret of the store
// (kept in the bbolt meta bucket, or made per process by the memory
// backend) over everything before it. A token that was altered, issued by
// another store, or issued for another scope, prefix or direction is
// rejected with INVALID_ARGUMENT. The next page starts strictly after
// (reversed: before) the last key, so
// paging stays stable while keys are added or removed: no key that exists
// throughout is skipped or repeated.

const (
	tokenVersion = 1
	// tokenVersionReverse marks a token of a reversed listing.
	tokenVersionReverse = 2
	hashLen             = 16
	macLen              = sha256.Size
	tokenHeader         = 1 + 2*hashLen
	// tokenSecretLen is the size of the HMAC secret.
	tokenSecretLen = 32
)

// tokenSigner issues and checks page tokens under one secret.
type tokenSigner struct {
	secret []byte
}

func shortHash(b []byte) []byte {
	sum := sha256.Sum256(b)
	return sum[:hashLen]
}

func (t tokenSigner) mac(payload []byte) []byte {
	h := hmac.New(sha256.New, t.secret)
	h.Write(payload)
	return h.Sum(nil)
}

// issue returns a token that continues a listing of prefix in the scope
// encoded as scopeEnc after lastKey (reverse: before it, descending).
func (t tokenSigner) issue(scopeEnc []byte, prefix, lastKey string, reverse bool) string {
	payload := make([]byte, 0, tokenHeader+len(lastKey)+macLen)
	payload = append(payload, versionOf(reverse))
	payload = append(payload, shortHash(scopeEnc)...)
	payload = append(payload, shortHash([]byte(prefix))...)
	payload = append(payload, lastKey...)
	payload = append(payload, t.mac(payload)...)
	return base64.RawURLEncoding.EncodeToString(payload)
}

func versionOf(reverse bool) byte {
	if reverse {
		return tokenVersionReverse
	}
	return tokenVersion
}

// open checks token and returns the last key it carries.
func (t tokenSigner) open(token string, scopeEnc []byte, prefix string, reverse bool) (string, error) {
	raw, err := base64.RawURLEncoding.Strict().DecodeString(token)
	// The decoder skips line breaks: a token is taken only as issued,
	// the one encoding of its bytes.
	if err != nil || base64.RawURLEncoding.EncodeToString(raw) != token || len(raw) < tokenHeader+macLen || (raw[0] != tokenVersion && raw[0] != tokenVersionReverse) {
		return "", fmt.Errorf("page_token is malformed; pass the next_page_token of the previous page unchanged: %w", errs.InvalidArgument)
	}
	payload, sum := raw[:len(raw)-macLen], raw[len(raw)-macLen:]
	if !hmac.Equal(sum, t.mac(payload)) {
		return "", fmt.Errorf("page_token was not issued by this server or was altered: %w", errs.InvalidArgument)
	}
	if !hmac.Equal(payload[1:1+hashLen], shortHash(scopeEnc)) || !hmac.Equal(payload[1+hashLen:tokenHeader], shortHash([]byte(prefix))) {
		return "", fmt.Errorf("page_token was issued for a different scope or prefix: %w", errs.InvalidArgument)
	}
	if payload[0] != versionOf(reverse) {
		return "", fmt.Errorf("page_token was issued for a listing in the other direction (reverse = %t); keep reverse as on the first page: %w", !reverse, errs.InvalidArgument)
	}
	return string(payload[tokenHeader:]), nil
}
