// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package server

import (
	"net/url"
	"strings"
)

// A path is classified in its canonical form, and that form is what the upstream
// receives, so that no spelling an upstream (or a web server in front of it) would
// normalise to a charged route reaches it uncharged.
//
// The canonical form of an escaped path: percent-encoded unreserved characters
// decoded (RFC 3986 section 2.3), repeated slashes collapsed, dot segments resolved
// (a ".." above the root is dropped, as RFC 3986 section 5.2.4 does, rather than
// refused), and a trailing slash dropped. Other escapes stay escaped.
//
// Escapes that may change a path's meaning (%2F, %5C) and letter case are not part of
// the canonical form, but an upstream may still read through them: when the path,
// fully decoded (a backslash read as a slash) and canonicalised again, or lowercased,
// is a charged route, the request is that route: it is charged and the route's own
// path is forwarded.

// canonicalPath returns the canonical form of an escaped path. A path already in
// canonical form is returned as it is, without allocating.
func canonicalPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' || isCanonical(p) {
		return p
	}
	b := make([]byte, 0, len(p))
	// Resolve segment by segment; kept holds where each kept segment starts in b.
	var kept []int
	for rest := p[1:]; ; {
		seg, tail, more := strings.Cut(rest, "/")
		switch seg = decodeUnreserved(seg); seg {
		case "", ".":
		case "..":
			if n := len(kept); n > 0 {
				b, kept = b[:kept[n-1]], kept[:n-1]
			}
		default:
			kept = append(kept, len(b))
			b = append(append(b, '/'), seg...)
		}
		if !more {
			break
		}
		rest = tail
	}
	if len(b) == 0 {
		return "/"
	}
	return string(b)
}

// isCanonical reports whether p (which starts with a slash) needs no change.
func isCanonical(p string) bool {
	if len(p) > 1 && p[len(p)-1] == '/' {
		return false
	}
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '%':
			return false
		case '/':
			// A slash followed by another slash or by a dot segment.
			rest := p[i+1:]
			if strings.HasPrefix(rest, "/") || rest == "." || rest == ".." ||
				strings.HasPrefix(rest, "./") || strings.HasPrefix(rest, "../") {
				return false
			}
		}
	}
	return true
}

// decodeUnreserved decodes the escapes of unreserved characters in a segment,
// upper-cases the hex of the others, and escapes a percent sign that starts none.
func decodeUnreserved(seg string) string {
	if strings.IndexByte(seg, '%') < 0 {
		return seg
	}
	var b strings.Builder
	b.Grow(len(seg))
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		var hi, lo byte
		ok := i+2 < len(seg)
		if ok {
			var ok1, ok2 bool
			hi, ok1 = unhex(seg[i+1])
			lo, ok2 = unhex(seg[i+2])
			ok = ok1 && ok2
		}
		if !ok {
			// A percent sign that starts no escape is a percent sign.
			b.WriteString("%25")
			continue
		}
		v := hi<<4 | lo
		if unreserved(v) {
			b.WriteByte(v)
		} else {
			const hexDigits = "0123456789ABCDEF"
			b.WriteByte('%')
			b.WriteByte(hexDigits[v>>4])
			b.WriteByte(hexDigits[v&15])
		}
		i += 2
	}
	return b.String()
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func unreserved(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// readThrough is what an upstream that decodes every escape, reads a backslash as a
// slash and ignores case could take a canonical path for; ok is false when that is
// the path itself.
func readThrough(p string) (string, bool) {
	lower := strings.ToLower(p)
	if !strings.ContainsAny(lower, `%\`) {
		return lower, lower != p
	}
	decoded, err := url.PathUnescape(lower)
	if err != nil {
		return "", false
	}
	decoded = strings.ReplaceAll(decoded, `\`, "/")
	// The decoded path is canonicalised as a path of its own: escape what would read
	// as an escape again, so that "%2525" is not decoded twice.
	return canonicalPath(strings.ReplaceAll(decoded, "%", "%25")), true
}

// setEscapedPath makes u's path the escaped path p.
func setEscapedPath(u *url.URL, p string) {
	path, err := url.PathUnescape(p)
	if err != nil {
		path = p
	}
	u.Path = path
	u.RawPath = ""
	if path != p {
		u.RawPath = p
	}
}
