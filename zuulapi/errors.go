package zuulapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
)

// Sentinel errors: test for them with errors.Is. The errors returned by the
// Client wrap one of these together with a message that says what to do.
var (
	// ErrUnauthorized: Zuul answered 401; the token is missing, invalid or expired.
	ErrUnauthorized = errors.New("unauthorized by Zuul")
	// ErrForbidden: Zuul answered 403; the token is valid but lacks access.
	ErrForbidden = errors.New("forbidden by Zuul")
	// ErrUnknownTenant: Zuul answered 404 for the tenant's API.
	ErrUnknownTenant = errors.New("unknown Zuul tenant")
	// ErrTenantNotLoaded: Zuul answered 422; the tenant exists but its
	// configuration is not loaded yet. Retrying later is the cure.
	ErrTenantNotLoaded = errors.New("zuul tenant not loaded yet")
	// ErrServer: Zuul kept answering with a 5xx status after all retries.
	ErrServer = errors.New("zuul server error")
	// ErrNoTenant: no tenant was configured and the API root is not
	// white-labelled, so there is no way to tell which tenant to ask.
	ErrNoTenant = errors.New("no Zuul tenant")
	// ErrUnexpected: any other status, or a body that is not what Zuul sends.
	ErrUnexpected = errors.New("unexpected answer from Zuul")
)

// Error is a failed exchange with Zuul: the HTTP status, the URL asked and
// what Zuul said about it. It unwraps to one of the sentinel errors.
type Error struct {
	// StatusCode is the HTTP status; 0 when the body, not the status, was wrong.
	StatusCode int
	// URL is the URL that was requested.
	URL string
	// Description is Zuul's own explanation, when it gave one.
	Description string

	kind error
	msg  string
}

// FailureClass tells the metrics that Zuul failed or could not be reached
// (see metrics.Classify).
func (*Error) FailureClass() string { return "remote" }

// Error returns the message, which says what failed and what to do.
func (e *Error) Error() string { return e.msg }

// Unwrap returns the sentinel error that classifies e.
func (e *Error) Unwrap() error { return e.kind }

var htmlParagraph = regexp.MustCompile(`(?is)<p>(.*?)</p>`)
var htmlTag = regexp.MustCompile(`(?s)<[^>]*>`)

// describe pulls a human explanation out of an error body. Zuul answers auth
// failures with JSON {description, error, realm} and most other errors with
// CherryPy's HTML error page, whose first paragraph holds the message.
func describe(body []byte) string {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return ""
	}
	if body[0] == '{' {
		var doc struct {
			Description string `json:"description"`
			Error       string `json:"error"`
		}
		if json.Unmarshal(body, &doc) == nil {
			if doc.Description != "" {
				return doc.Description
			}
			return doc.Error
		}
	}
	text := string(body)
	if body[0] == '<' {
		m := htmlParagraph.FindStringSubmatch(text)
		if m == nil {
			return ""
		}
		text = htmlTag.ReplaceAllString(m[1], "")
	}
	text = strings.Join(strings.Fields(text), " ")
	const max = 200
	if len(text) > max {
		text = text[:max] + "..."
	}
	return text
}
