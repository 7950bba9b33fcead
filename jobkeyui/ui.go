// Package jobkeyui is an embeddable web UI for jobkey queues: the queues
// under a key prefix with live counts, each queue's jobs by state, one job
// with every field the value holds, and the actions retry, cancel, delete,
// their bulk forms, pause and resume.
//
// New returns an http.Handler that a service mounts in its own mux, behind
// its own authentication; the handler has none of its own:
//
//	ui, err := jobkeyui.New(rdb, jobkeyui.Options{BasePath: "/jobs/"})
//	if err != nil { ... }
//	mux.Handle("/jobs/", requireAdmin(http.StripPrefix("/jobs", ui)))
//
// Pages are rendered with html/template from templates embedded in the
// binary, with one embedded stylesheet: no JavaScript, no CDN, no build
// step. Actions are POST requests carrying a CSRF token bound to a
// SameSite=Strict cookie; Options.ReadOnly hides and refuses them.
package jobkeyui

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/redis/go-redis/v9"
)

// Options configure the handler New returns. The zero value serves the
// queues under the prefix "jobkey" at the root path, with actions enabled.
type Options struct {
	// Prefix is the key prefix of the queues to show (default "jobkey").
	Prefix string
	// BasePath is the URL path under which the browser reaches the
	// handler, such as "/jobs/" (default "/"); links and cookies are built
	// under it. The handler itself serves paths with BasePath cut off:
	// mount it with http.StripPrefix("/jobs", h).
	BasePath string
	// ReadOnly hides every action and refuses them with 403 Forbidden.
	ReadOnly bool
	// PageSize is how many jobs a listing shows per page (default 50, at
	// most 1000).
	PageSize int
	// CSRFKey signs the CSRF tokens. Leave it nil for a random key drawn by
	// New; set the same key of at least 32 bytes on every replica when
	// several serve one site behind a load balancer.
	CSRFKey []byte
	// Logger receives the errors answered with 500 (default slog.Default()).
	Logger *slog.Logger
	// MinReplicas and ReplicaTimeout are the Config.MinReplicas and
	// Config.ReplicaTimeout of the queues the handler opens: every action
	// that writes a job waits until that many replicas confirm it, as the
	// service's own writes do. One they do not confirm in time answers
	// with an error page that says it was applied on the master only
	// (default: 0, no wait; ReplicaTimeout 1s).
	MinReplicas    int
	ReplicaTimeout time.Duration
	// Retention and FailedRetention are the Config.Retention and
	// Config.FailedRetention the queues' workers keep finished jobs for,
	// which Redis does not store: the counts of finished jobs cover them,
	// the history page says from when its counts are exact by them, and a
	// job the UI cancels keeps Retention (default: jobkey's, 24h and 7
	// days).
	Retention, FailedRetention time.Duration
}

// Handler is the web UI. It is safe for concurrent use.
type Handler struct {
	rdb      redis.UniversalClient
	prefix   string
	base     string // "/" or "/path/"
	readOnly bool
	pageSize int
	csrfKey  []byte
	log      *slog.Logger
	// minReplicas and replicaTimeout are the Options', for the queues the
	// handler opens.
	minReplicas    int
	replicaTimeout time.Duration
	// retention and failedRetention are the Options', likewise.
	retention, failedRetention time.Duration
	mux                        *http.ServeMux
	pages                      *pages

	mu     sync.Mutex
	queues map[string]openQueue // opened queues, by name
}

// New returns the web UI over the queues that rdb holds under o.Prefix.
// rdb stays the caller's: the handler never closes it.
func New(rdb redis.UniversalClient, o Options) (*Handler, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: jobkeyui.New with a nil Redis client", jobkey.ErrInvalid)
	}
	h := &Handler{
		rdb: rdb, prefix: o.Prefix, readOnly: o.ReadOnly, pageSize: o.PageSize,
		log: o.Logger, queues: map[string]openQueue{},
		minReplicas: o.MinReplicas, replicaTimeout: o.ReplicaTimeout,
		retention: o.Retention, failedRetention: o.FailedRetention,
	}
	if h.prefix == "" {
		h.prefix = "jobkey"
	}
	// The queues are opened per request; a setting jobkey refuses (the
	// prefix, the replicas) is refused now, as jobkey would refuse it.
	// NewQueue does not talk to Redis.
	if _, err := jobkey.NewQueue(rdb, "jobkeyui", h.config(1)); err != nil {
		return nil, err
	}
	if h.pageSize == 0 {
		h.pageSize = 50
	}
	if h.pageSize < 1 || h.pageSize > 1000 {
		return nil, fmt.Errorf("%w: PageSize %d is outside 1..1000", jobkey.ErrInvalid, o.PageSize)
	}
	base, err := cleanBase(o.BasePath)
	if err != nil {
		return nil, err
	}
	h.base = base
	switch {
	case o.CSRFKey == nil:
		h.csrfKey = make([]byte, 32)
		if _, err := rand.Read(h.csrfKey); err != nil {
			return nil, fmt.Errorf("jobkeyui: draw a CSRF key: %w", err)
		}
	case len(o.CSRFKey) < 32:
		return nil, fmt.Errorf("%w: CSRFKey has %d bytes, at least 32 needed", jobkey.ErrInvalid, len(o.CSRFKey))
	default:
		h.csrfKey = append([]byte(nil), o.CSRFKey...)
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	if h.pages, err = parsePages(); err != nil {
		return nil, err
	}
	h.routes()
	return h, nil
}

// cleanBase makes a base path "/" or "/a/b/".
func cleanBase(p string) (string, error) {
	if p == "" {
		return "/", nil
	}
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?#\"'<> \\") || strings.Contains(p, "//") {
		return "", fmt.Errorf("%w: BasePath %q must be an absolute URL path such as \"/jobs/\"", jobkey.ErrInvalid, p)
	}
	if !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return p, nil
}

func (h *Handler) routes() {
	m := http.NewServeMux()
	m.HandleFunc("/{$}", h.queuesPage)
	m.HandleFunc("/queue", h.queuePage)
	m.HandleFunc("/job", h.jobPage)
	m.HandleFunc("/history", h.historyPage)
	m.HandleFunc("/workers", h.workersPage)
	m.HandleFunc("/keys", h.keysPage)
	m.HandleFunc("/batches", h.batchesPage)
	m.HandleFunc("/events", h.eventsPage)
	m.HandleFunc("/static/", h.static)
	for path, a := range h.actions() {
		m.Handle("/action/"+path, a)
	}
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, http.StatusNotFound, errors.New("no such page"))
	})
	h.mux = m
}

// ServeHTTP serves the UI. It sets its security headers on every answer.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	// No script runs on these pages, from anywhere; styles and images
	// come from the handler only; forms post only back to it; no site may
	// frame it.
	hd.Set("Content-Security-Policy",
		"default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "same-origin")
	h.mux.ServeHTTP(w, r)
}
