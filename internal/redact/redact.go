// Package redact keeps the passwords of Redis URLs out of what the
// command and the benchmarks print: messages, logs and reports.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Mask is what a password is replaced with, as url.URL.Redacted does.
const Mask = "xxxxx"

// secret returns where the password in the userinfo of s lies, as
// written, whether or not s parses as a URL: between the first ":" after
// the scheme and the last "@". A userinfo without ":" is taken whole, since
// some clients read a lone user as the password. start == end when s has
// no userinfo.
func secret(s string) (start, end int) {
	from := 0
	if i := strings.Index(s, "://"); i >= 0 {
		from = i + len("://")
	}
	at := strings.LastIndex(s[from:], "@")
	if at <= 0 {
		return 0, 0
	}
	at += from
	if c := strings.Index(s[from:at], ":"); c >= 0 {
		return from + c + 1, at
	}
	return from, at
}

// URL returns s with its password replaced by Mask, whether or not s
// parses: an unparsable URL is what gets echoed in an error.
func URL(s string) string {
	start, end := secret(s)
	if start == end {
		return s
	}
	return s[:start] + Mask + s[end:]
}

// quoted finds the quoted pieces of a message, where parsers echo the
// part of a URL they choke on (`invalid URL escape "%zc"`).
var quoted = regexp.MustCompile(`"[^"]*"`)

// Text returns msg with the password of every URL of urls replaced by
// Mask: as written and percent-decoded, and any quoted piece of msg (of
// three bytes or more) that is part of it.
func Text(msg string, urls ...string) string {
	for _, u := range urls {
		start, end := secret(u)
		if start == end {
			continue
		}
		raw := u[start:end]
		forms := []string{raw}
		if dec, err := url.PathUnescape(raw); err == nil && dec != raw {
			forms = append(forms, dec)
		}
		for _, f := range forms {
			msg = strings.ReplaceAll(msg, f, Mask)
		}
		msg = quoted.ReplaceAllStringFunc(msg, func(q string) string {
			if in := q[1 : len(q)-1]; len(in) >= 3 && strings.Contains(raw, in) {
				return `"` + Mask + `"`
			}
			return q
		})
	}
	return msg
}

// Error returns err with its text redacted as Text does; errors.Is and
// errors.As still see err. It returns err itself when there was nothing to
// redact, and nil for nil.
func Error(err error, urls ...string) error {
	if err == nil {
		return nil
	}
	msg := Text(err.Error(), urls...)
	if msg == err.Error() {
		return err
	}
	return &redacted{msg: msg, err: err}
}

type redacted struct {
	msg string
	err error
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }
