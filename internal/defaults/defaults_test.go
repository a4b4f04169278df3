package defaults

import (
	"testing"
	"time"
)

func TestPositive(t *testing.T) {
	for _, c := range []struct{ v, want time.Duration }{
		{0, time.Minute},
		{-time.Second, time.Minute},
		{time.Nanosecond, time.Nanosecond},
		{time.Hour, time.Hour},
	} {
		if got := Positive(c.v, time.Minute); got != c.want {
			t.Errorf("Positive(%v, 1m) = %v, want %v", c.v, got, c.want)
		}
	}
	if got := Positive(0, 4); got != 4 {
		t.Errorf("Positive(0, 4) = %d, want 4", got)
	}
}
