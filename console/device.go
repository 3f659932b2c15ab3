package console

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"strings"
	"time"

	"github.com/gorilla/securecookie"
)

// A browser where a user signed in gets a device cookie naming the user.
// Its sign-ins as that user are limited by a budget of its own, not by the
// budgets of the user name and the client address, which anyone can spend:
// an attacker who guesses at an operator's name locks out browsers that
// have never signed in as that operator, and never the operator's own.
// This is the "device cookie" defence of OWASP's authentication guidance,
// chosen over keys of address and name because the documented ways in (an
// SSH tunnel, a TLS proxy) give every client the same address.

const deviceCookieName = "wlproj_console_device"

// deviceTTL is how long a browser stays known after its last sign-in: an
// operator who signs in at least once a month is never held back by
// someone else's guesses.
const deviceTTL = 30 * 24 * time.Hour

// device is what the device cookie holds, signed and encrypted.
type device struct {
	ID   string `json:"id"`
	User string `json:"user"`
	// Mark is the user's password mark at sign-in: a new password in the
	// users file makes every browser of the user unknown again.
	Mark string `json:"mark"`
}

// newDeviceCodec signs and encrypts device cookies with keys of their own,
// derived from the session secret: replicas sharing the key file know each
// other's browsers.
func newDeviceCodec(derive func(label string, n int) []byte) *securecookie.SecureCookie {
	return securecookie.New(derive("device hash", 32), derive("device block", 32)).
		SetSerializer(securecookie.JSONEncoder{}).MaxAge(int(deviceTTL.Seconds()))
}

// knownDevice returns the request's device cookie if it names u and u's
// current password, else nil.
func (s *sessions) knownDevice(r *http.Request, u *user) *device {
	c, err := r.Cookie(deviceCookieName)
	if err != nil || u == nil {
		return nil
	}
	var d device
	if s.devices.Decode(deviceCookieName, c.Value, &d) != nil || d.ID == "" || d.User != u.Name ||
		!hmac.Equal([]byte(d.Mark), []byte(s.mark(u))) {
		return nil
	}
	return &d
}

// rememberDevice gives the browser a device cookie for u, keeping the ID
// of the one it had for u, so that its budget is not renewed by signing in.
func (s *sessions) rememberDevice(w http.ResponseWriter, r *http.Request, u *user, known *device) error {
	d := device{User: u.Name, Mark: s.mark(u)}
	if known != nil {
		d.ID = known.ID
	} else {
		id := make([]byte, 18)
		if _, err := rand.Read(id); err != nil {
			return err
		}
		d.ID = base64.RawURLEncoding.EncodeToString(id)
	}
	v, err := s.devices.Encode(deviceCookieName, d)
	if err != nil {
		return err
	}
	http.SetCookie(w, &http.Cookie{Name: deviceCookieName, Value: v, Path: Prefix + "signin",
		MaxAge: int(deviceTTL.Seconds()), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return nil
}

// signInKeys are the budgets a sign-in attempt as name pays: its own
// browser's if that browser signed in as name before, else the client
// address's and the name's, shared with everyone else.
func (s *sessions) signInKeys(r *http.Request, u *user, name string) (keys []string, known *device) {
	if known = s.knownDevice(r, u); known != nil {
		return []string{"device:" + known.ID}, known
	}
	return []string{"addr:" + clientIP(r), "user:" + strings.ToLower(name)}, nil
}
