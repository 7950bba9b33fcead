package jobkeyui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"time"
)

// The session cookie holds a random value; the CSRF token in every form is
// HMAC-SHA256(Handler.csrfKey, that value). A POST is accepted only when
// its form token is the HMAC of its cookie. Another site can make the
// browser send the cookie (not with SameSite=Strict, and not read it), but
// it cannot compute the token without the key.
const (
	sessionCookie = "jobkey_ui_session"
	flashCookie   = "jobkey_ui_flash"
	csrfField     = "csrf"
)

// session returns the browser's session value, setting a new cookie when
// it has none (or a malformed one).
func (h *Handler) session(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(sessionCookie); err == nil && validSession(c.Value) {
		return c.Value
	}
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on a supported OS
	v := base64.RawURLEncoding.EncodeToString(b[:])
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: v, Path: h.base, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
	return v
}

func validSession(v string) bool {
	b, err := base64.RawURLEncoding.DecodeString(v)
	return err == nil && len(b) == 32
}

// token is the CSRF token of a session.
func (h *Handler) token(session string) string {
	m := hmac.New(sha256.New, h.csrfKey)
	m.Write([]byte(session))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkCSRF reports whether r carries the token of its own session cookie.
// The form must be parsed.
func (h *Handler) checkCSRF(r *http.Request) bool {
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		return false // a browser that says so: another site sent this
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil || !validSession(c.Value) {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(r.PostForm.Get(csrfField))
	if err != nil {
		return false
	}
	want, _ := base64.RawURLEncoding.DecodeString(h.token(c.Value))
	return hmac.Equal(got, want) // constant time
}

// setFlash leaves a message for the next page the browser loads.
func (h *Handler) setFlash(w http.ResponseWriter, r *http.Request, msg string) {
	http.SetCookie(w, &http.Cookie{
		Name: flashCookie, Value: base64.RawURLEncoding.EncodeToString([]byte(msg)), Path: h.base,
		MaxAge: 60, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
}

// takeFlash returns the message left for this page, and clears it.
func (h *Handler) takeFlash(w http.ResponseWriter, r *http.Request) string {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return ""
	}
	http.SetCookie(w, &http.Cookie{
		Name: flashCookie, Value: "", Path: h.base, MaxAge: -1, Expires: time.Unix(1, 0),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
	b, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil || len(b) > 1000 {
		return ""
	}
	return string(b)
}
