package artifacts

// classed is an error of this package that says which class of failure it is,
// so that the metrics count it without knowing this package (see
// metrics.Classify).
type classed struct{ msg, class string }

func (e *classed) Error() string { return e.msg }

// FailureClass is the metrics' reason for the failure.
func (e *classed) FailureClass() string { return e.class }
