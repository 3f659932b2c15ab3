package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
)

// Every POST of the console, sign-in and sign-out included, passes two
// checks before its handler runs:
//
//  1. The browser's own word on where the request comes from (Sec-Fetch-Site,
//     else Origin against Host), by net/http's CrossOriginProtection: a form
//     of another site, or of another replica's port, is refused.
//  2. The form's token (field "csrf") must be the session's: an HMAC of the
//     session id under a key derived from the session secret. It needs no
//     storage, is the same on every replica sharing the key file, changes
//     with every sign-in, and is worthless without the HttpOnly,
//     SameSite=Strict cookie it belongs to (withSession checks it).
//
// Either stops a plain cross-site form. Together, a token that leaked (a
// saved page, a screenshot of the source) is no use from another origin,
// and a client that sends neither header, which the first lets through,
// still needs the token.

// token is the form token of a session.
func (s *sessions) token(sess *session) string {
	m := hmac.New(sha256.New, s.csrfKey)
	m.Write([]byte(sess.SID))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// tokenOK reports whether the form carries sess's token.
func (s *sessions) tokenOK(sess *session, got string) bool {
	return sess != nil && hmac.Equal([]byte(s.token(sess)), []byte(got))
}
