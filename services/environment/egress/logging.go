package egress

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
)

// What the proxy logs about a request is chosen by the client inside the
// sandbox, which may hold a secret and try to get it out through the
// administrator's logs (a request for https://<secret>.attacker.example/
// is denied, and the denial is logged). Two layers keep it out:
//
//   - Names the client chose never reach a log line, nor Stats, verbatim:
//     logDest renders them as a keyed hash (see there). Names written by
//     the spec or the administrator (rule hosts, credential hosts, pinned
//     hosts) and IP literals are logged as they are.
//   - Every log record, including net/http's own error lines, goes
//     through scrub.NewHandler with a Scrubber built from the invocation's
//     secrets (Config.Secrets and the credential values; it finds them in
//     any case, as host names are lower-cased), which also replaces
//     anything shaped like a credential.

// logDest renders t for the logs and Stats. IP literals, and names the
// spec or the administrator wrote (exact rule hosts, credential hosts,
// pinned hosts), appear as they are. Any other name appears as
// "<h:0123456789ab>", a keyed hash of the whole name, followed by the
// suffix of the longest wildcard rule it matches
// ("<h:0123456789ab>.example.com:443"), so that the rule that decided it
// is plain and no label the client chose is. The hash key is random per
// proxy: the form ties one invocation's log lines together and cannot be
// reversed by guessing names offline.
func (p *Proxy) logDest(t *target) string {
	if t.ip.IsValid() || p.known[t.host] {
		return t.String()
	}
	suffix := ""
	for _, r := range p.policy.Rules {
		if strings.HasPrefix(r.Host, "*.") && hostMatches(r.Host, t.host) && len(r.Host)-1 > len(suffix) {
			suffix = r.Host[1:]
		}
	}
	m := hmac.New(sha256.New, p.logKey[:])
	m.Write([]byte(t.host))
	return fmt.Sprintf("<h:%s>%s:%d", hex.EncodeToString(m.Sum(nil)[:6]), suffix, t.port)
}

// logErr renders err for the logs, with t's name in its log form. A DNS
// error is reduced to the resolver's verdict and address: the name it
// carries is the client's.
func (p *Proxy) logErr(t *target, err error) string {
	var de *net.DNSError
	if errors.As(err, &de) {
		s := "dns: " + de.Err
		if de.Server != "" {
			s += " (server " + de.Server + ")"
		}
		return s
	}
	s := err.Error()
	if !t.ip.IsValid() && !p.known[t.host] {
		s = strings.ReplaceAll(s, t.host, p.logDest(t))
	}
	return s
}
