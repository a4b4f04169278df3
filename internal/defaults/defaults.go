// Package defaults fills in the options a caller left unset: a count or a
// duration of zero, or below, takes its default.
package defaults

// Positive is v when it is above zero, else def.
func Positive[T ~int | ~int64 | ~float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
