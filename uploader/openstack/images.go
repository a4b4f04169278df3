package openstack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/pagination"

	"github.com/nodepool-builder/nodepool-builder/internal/redact"
	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// coreAttributes are Glance's own image fields. As a property or list filter they would
// change or shadow the image itself, so they are refused there.
var coreAttributes = []string{
	"checksum", "container_format", "created_at", "direct_url", "disk_format", "file", "id",
	"locations", "min_disk", "min_ram", "name", "os_hash_algo", "os_hash_value", "os_hidden",
	"owner", "protected", "schema", "self", "size", "status", "stores", "tags", "updated_at",
	"virtual_size", "visibility",
}

// listParams are query parameters of GET /v2/images that are not filters on a property.
var listParams = []string{"limit", "marker", "sort", "sort_key", "sort_dir", "member_status", "tag", "size_min", "size_max"}

// Create makes an empty private image with the spec's name, disk format and properties,
// and returns its ID.
func (c *Cloud) Create(ctx context.Context, spec uploader.ImageSpec) (string, error) {
	for k := range spec.Properties {
		if slices.Contains(coreAttributes, k) {
			return "", fmt.Errorf("create image %q in cloud %s: property %q is a Glance image field, not a property", spec.Name, c.name, k)
		}
	}
	sc, err := c.imageService(ctx)
	if err != nil {
		return "", fmt.Errorf("create image %q: %w", spec.Name, err)
	}
	private := images.ImageVisibilityPrivate
	img, err := images.Create(ctx, sc, images.CreateOpts{
		Name:            spec.Name,
		DiskFormat:      spec.DiskFormat,
		ContainerFormat: "bare",
		Visibility:      &private,
		Properties:      spec.Properties,
	}).Extract()
	if err != nil {
		return "", fmt.Errorf("create image %q in cloud %s: %w", spec.Name, c.name, c.classify(err))
	}
	c.log.Debug("created image", "id", img.ID, "name", spec.Name)
	return img.ID, nil
}

// Upload streams size bytes from data into the image; a negative size means unknown and
// sends the data chunked. The data is never held in memory, and data is not closed.
// When Glance refuses the token of the PUT, the upload logs in again and sends the
// data again from where it stood if data is an io.Seeker, and fails otherwise.
func (c *Cloud) Upload(ctx context.Context, id string, data io.Reader, size int64) error {
	if id == "" {
		return fmt.Errorf("upload to cloud %s: no image id", c.name)
	}
	return c.sendData(ctx, id, "file", fmt.Sprintf("upload image %s to cloud %s", id, c.name), data, size)
}

// sendData PUTs size bytes of data to the image's data resource, "file" or
// "stage", as Upload says; what names the call in its errors.
func (c *Cloud) sendData(ctx context.Context, id, resource, what string, data io.Reader, size int64) error {
	sc, err := c.imageService(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	// An authenticated GET first: gophercloud renews an expired token on a request it can
	// repeat, rather than on the PUT, whose body cannot be sent twice. It also reports a
	// missing image before any data moves.
	if _, err := images.Get(ctx, sc, id).Extract(); err != nil {
		return fmt.Errorf("%s: %w", what, c.getError(err))
	}

	target := sc.ServiceURL("images", id, resource)
	// Where the data starts: when Glance refuses the token (it expired just as the
	// PUT began), the data is sent again from there with a new one. A reader that
	// cannot seek cannot be sent twice.
	seeker, canRewind := data.(io.Seeker)
	var from int64
	if canRewind {
		if from, err = seeker.Seek(0, io.SeekCurrent); err != nil {
			canRewind = false
		}
	}
	start := time.Now()
	for sent := 1; ; sent++ {
		token := sc.Token()
		status, body, header, err := c.put(ctx, sc, target, data, size)
		if err != nil {
			return fmt.Errorf("%s: %w", what, c.classify(err))
		}
		if status == http.StatusUnauthorized && c.auth != nil && sent == 1 {
			if !canRewind {
				return fmt.Errorf("%s: Glance refused the token (HTTP 401) after the data had started, "+
					"and this data cannot be sent again: the next try logs in again", what)
			}
			c.log.Debug("Glance refused the token of a PUT of image data; logging in again to send the data again", "id", id, "resource", resource)
			if err := sc.Reauthenticate(ctx, token); err != nil {
				return fmt.Errorf("%s: log in again after Glance refused the token: %w", what, c.identityError(err))
			}
			if _, err := seeker.Seek(from, io.SeekStart); err != nil {
				return fmt.Errorf("%s: rewind the data to send it again after Glance refused the token: %w", what, err)
			}
			continue
		}
		if status/100 != 2 {
			err := gophercloud.ErrUnexpectedResponseCode{
				URL:            target,
				Method:         http.MethodPut,
				Expected:       []int{http.StatusNoContent},
				Actual:         status,
				Body:           body,
				ResponseHeader: header,
			}
			return fmt.Errorf("%s: %w", what, c.getError(err))
		}
		break
	}
	c.log.Debug("sent image data", "id", id, "resource", resource, "bytes", size, "duration", time.Since(start))
	return nil
}

// put sends one PUT of the image data and returns Glance's answer.
func (c *Cloud) put(ctx context.Context, sc *gophercloud.ServiceClient, target string, data io.Reader, size int64) (int, []byte, http.Header, error) {
	// Hiding everything but Read keeps net/http from closing the caller's file and from
	// reading a size off the reader's type.
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, target, struct{ io.Reader }{data})
	if err != nil {
		return 0, nil, nil, err
	}
	req.ContentLength = -1
	if size >= 0 {
		req.ContentLength = size
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", sc.UserAgent.Join())
	for k, v := range sc.AuthenticatedHeaders() {
		req.Header.Set(k, v)
	}
	resp, err := sc.HTTPClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, body, resp.Header, nil
}

// Get returns the image; the error wraps uploader.ErrNotFound when Glance has no such image.
func (c *Cloud) Get(ctx context.Context, id string) (uploader.CloudImage, error) {
	if id == "" {
		return uploader.CloudImage{}, fmt.Errorf("get image from cloud %s: no image id", c.name)
	}
	sc, err := c.imageService(ctx)
	if err != nil {
		return uploader.CloudImage{}, fmt.Errorf("get image %s: %w", id, err)
	}
	img, err := images.Get(ctx, sc, id).Extract()
	if err != nil {
		return uploader.CloudImage{}, fmt.Errorf("get image %s from cloud %s: %w", id, c.name, c.getError(err))
	}
	return toImage(img), nil
}

// List returns every image whose properties include all of match, following Glance's
// pages to the end.
func (c *Cloud) List(ctx context.Context, match map[string]string) ([]uploader.CloudImage, error) {
	for k := range match {
		if slices.Contains(coreAttributes, k) || slices.Contains(listParams, k) {
			return nil, fmt.Errorf("list images in cloud %s: %q is not a property Glance can filter on", c.name, k)
		}
	}
	sc, err := c.imageService(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var out []uploader.CloudImage
	err = images.List(sc, propertyFilter{match: match, limit: c.pageSize}).EachPage(ctx, func(_ context.Context, page pagination.Page) (bool, error) {
		imgs, err := images.ExtractImages(page)
		if err != nil {
			return false, err
		}
		for i := range imgs {
			img := toImage(&imgs[i])
			// Glance filters on the server; checking again costs nothing and keeps a
			// server that ignores an unknown filter from handing us strangers' images.
			if hasAll(img.Properties, match) {
				out = append(out, img)
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list images in cloud %s matching %v: %w", c.name, match, c.classify(err))
	}
	return out, nil
}

// Delete removes the image; one that does not exist is already gone, which is no error.
func (c *Cloud) Delete(ctx context.Context, id string) error {
	if id == "" {
		return fmt.Errorf("delete image from cloud %s: no image id", c.name)
	}
	sc, err := c.imageService(ctx)
	if err != nil {
		return fmt.Errorf("delete image %s: %w", id, err)
	}
	err = images.Delete(ctx, sc, id).ExtractErr()
	switch {
	case err == nil:
		c.log.Debug("deleted image", "id", id)
		return nil
	case gophercloud.ResponseCodeIs(err, http.StatusNotFound):
		return nil
	case alreadyDeleted(err):
		// Another delete got there first (Glance refuses a second transition to deleted).
		c.log.Debug("image was already deleted", "id", id)
		return nil
	default:
		return fmt.Errorf("delete image %s from cloud %s: %w", id, c.name, c.classify(err))
	}
}

// alreadyDeleted tells whether Glance refused a delete because the image is deleted
// already: two deletes that race get "400 Image status transition from deleted to
// deleted is not allowed" (or from pending_delete, with delayed delete on).
func alreadyDeleted(err error) bool {
	var code gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &code) || code.Actual != http.StatusBadRequest {
		return false
	}
	body := string(code.Body)
	return strings.Contains(body, "transition from deleted to") || strings.Contains(body, "transition from pending_delete to")
}

// classify shortens an error from Glance (glanceError) and marks one that says the
// cloud could not serve now, a refused connection, a timeout or an HTTP 5xx, as
// uploader.ErrUnavailable: the same request may well succeed later. No userinfo
// of a URL shows in it.
func (c *Cloud) classify(err error) error {
	if err == nil {
		return nil
	}
	return redact.UserinfoError(c.classified(err))
}

func (c *Cloud) classified(err error) error {
	var code gophercloud.ErrUnexpectedResponseCode
	var netErr net.Error
	var reauth *gophercloud.ErrUnableToReauthenticate
	switch {
	case errors.As(err, &reauth):
		// Glance refused an expired token, and Keystone the login that would
		// have renewed it: the login is what failed.
		return c.identityError(reauth.ErrReauth)
	case errors.Is(err, context.Canceled), errors.Is(err, uploader.ErrUnavailable):
	case errors.As(err, &code):
		if code.Actual >= 500 {
			return fmt.Errorf("%w: %w", uploader.ErrUnavailable, glanceError(err))
		}
	case errors.As(err, &netErr):
		return fmt.Errorf("%w: %w", uploader.ErrUnavailable, err)
	}
	return glanceError(err)
}

// getError adds uploader.ErrNotFound to a 404 from Glance, and classifies the rest.
func (c *Cloud) getError(err error) error {
	if gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		return redact.UserinfoError(fmt.Errorf("%w: %w", uploader.ErrNotFound, glanceError(err)))
	}
	return c.classify(err)
}

// propertyFilter is a Glance list query: custom properties are filters in their own
// name, matched exactly.
type propertyFilter struct {
	match map[string]string
	limit int
}

// ToImageListQuery implements images.ListOptsBuilder.
func (f propertyFilter) ToImageListQuery() (string, error) {
	q := url.Values{}
	for k, v := range f.match {
		q.Set(k, v)
	}
	if f.limit > 0 {
		q.Set("limit", strconv.Itoa(f.limit))
	}
	return "?" + q.Encode(), nil
}

// hasAll reports whether props holds every key of match with the same value.
func hasAll(props, match map[string]string) bool {
	for k, v := range match {
		if got, ok := props[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// toImage converts gophercloud's image. Its Properties hold every field it has no struct
// field for, so Glance's own fields are dropped there to leave the custom properties.
func toImage(img *images.Image) uploader.CloudImage {
	props := make(map[string]string, len(img.Properties))
	for k, v := range img.Properties {
		if v == nil || slices.Contains(coreAttributes, k) {
			continue
		}
		if s, ok := v.(string); ok {
			props[k] = s
		} else {
			props[k] = fmt.Sprint(v)
		}
	}
	return uploader.CloudImage{
		ID:         img.ID,
		Name:       img.Name,
		Status:     string(img.Status),
		DiskFormat: img.DiskFormat,
		Size:       img.SizeBytes,
		Checksum:   img.Checksum,
		Created:    img.CreatedAt,
		Owner:      img.Owner,
		Properties: props,
	}
}

// statusError is an answer from Glance other than success. Its message is short enough
// for a log line and a last_error column; the gophercloud error with the whole body stays
// reachable through errors.As.
type statusError struct {
	status int
	detail string
	err    error
}

func (e *statusError) Error() string {
	msg := fmt.Sprintf("Glance answered HTTP %d %s", e.status, http.StatusText(e.status))
	if e.detail != "" {
		msg += ": " + e.detail
	}
	return msg
}

func (e *statusError) Unwrap() error { return e.err }

// glanceError shortens an unexpected-status error from gophercloud to a statusError and
// leaves any other error as it is.
func glanceError(err error) error {
	var code gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &code) {
		return err
	}
	return &statusError{status: code.Actual, detail: bodyDetail(code.Body, code.Actual), err: err}
}

var (
	htmlTag    = regexp.MustCompile(`<[^>]*>`)
	whitespace = regexp.MustCompile(`\s+`)
)

// bodyDetail pulls the human part out of an error body: Glance sends small HTML pages
// that repeat the status line, or JSON with a message.
func bodyDetail(body []byte, status int) string {
	text := string(bytes.TrimSpace(body))
	var doc struct {
		Message string `json:"message"`
		Error   struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &doc) == nil && coalesce(doc.Message, doc.Error.Message) != "" {
		text = coalesce(doc.Message, doc.Error.Message)
	}
	text = htmlTag.ReplaceAllString(text, " ")
	text = strings.TrimSpace(whitespace.ReplaceAllString(text, " "))
	statusLine := strconv.Itoa(status) + " " + http.StatusText(status)
	for strings.HasPrefix(text, statusLine) {
		text = strings.TrimSpace(strings.TrimPrefix(text, statusLine))
	}
	const max = 300
	if r := []rune(text); len(r) > max {
		text = string(r[:max]) + "..."
	}
	return text
}
