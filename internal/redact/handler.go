package redact

import (
	"context"
	"fmt"
	"log/slog"
)

// Handler wraps h so that no record it handles shows the userinfo of a URL (see
// Userinfo): in the message, and in every attribute, whether a string, an error, a
// fmt.Stringer (a *url.URL), a list of strings or any other value that prints one.
// It is the last stop of every log line, so a URL with a password in it that some
// part logs as it is, at whatever level, is shown without it.
func Handler(h slog.Handler) slog.Handler { return handler{h} }

type handler struct{ next slog.Handler }

func (h handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, Userinfo(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(as))
	for i, a := range as {
		clean[i] = attr(a)
	}
	return handler{h.next.WithAttrs(clean)}
}

func (h handler) WithGroup(name string) slog.Handler { return handler{h.next.WithGroup(name)} }

// attr returns a with the userinfo of URLs removed from its value. A value that
// holds none is passed on as it is, so that handlers render it as they would.
func attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		if s := Userinfo(v.String()); s != v.String() {
			return slog.String(a.Key, s)
		}
	case slog.KindGroup:
		group := v.Group()
		clean := make([]any, len(group))
		for i, g := range group {
			clean[i] = attr(g)
		}
		return slog.Group(a.Key, clean...)
	case slog.KindAny:
		if clean, changed := anyValue(v.Any()); changed {
			return slog.Any(a.Key, clean)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// anyValue returns what to log instead of v when v prints the userinfo of a URL.
func anyValue(v any) (any, bool) {
	var s string
	switch x := v.(type) {
	case error:
		s = x.Error()
	case fmt.Stringer:
		s = x.String()
	case []string:
		var clean []string
		for i, e := range x {
			if c := Userinfo(e); c != e {
				if clean == nil {
					clean = append([]string(nil), x...)
				}
				clean[i] = c
			}
		}
		return clean, clean != nil
	default:
		s = fmt.Sprintf("%+v", v)
	}
	if c := Userinfo(s); c != s {
		return c, true
	}
	return v, false
}
