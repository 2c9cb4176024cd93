package validation

import (
	"fmt"
	"strings"
)

// Error is what is wrong with one object: one or more problems, in the
// order found.
type Error struct {
	errs []error
}

// Error lists the problems as Istio's webhook does: a single problem as it
// is, several as "N errors occurred:" and one "\t* " line each.
func (e *Error) Error() string {
	if len(e.errs) == 1 {
		return e.errs[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d errors occurred:\n", len(e.errs))
	for _, err := range e.errs {
		b.WriteString("\t* ")
		b.WriteString(err.Error())
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	return b.String()
}

// Unwrap returns the problems.
func (e *Error) Unwrap() []error { return e.errs }

// Summary is err on one line, its problems joined by "; ", for an Event or
// a log line; "" for nil.
func Summary(err error) string {
	if err == nil {
		return ""
	}
	if list, ok := err.(*Error); ok {
		parts := make([]string, len(list.errs))
		for i, e := range list.errs {
			parts[i] = Summary(e)
		}
		return strings.Join(parts, "; ")
	}
	return err.Error()
}

// errs collects problems; a nil error adds nothing and an *Error adds each
// of its problems, so that results nest without growing lists of lists.
// (Only an *Error itself is flattened: one wrapped with context keeps it.)
type errs []error

func (l *errs) add(es ...error) {
	for _, err := range es {
		if list, ok := err.(*Error); ok {
			*l = append(*l, list.errs...)
		} else if err != nil {
			*l = append(*l, err)
		}
	}
}

func (l *errs) addf(format string, a ...any) { l.add(fmt.Errorf(format, a...)) }

// err is nil without problems, else an *Error.
func (l errs) err() error {
	if len(l) == 0 {
		return nil
	}
	return &Error{errs: l}
}

// prefixed wraps each problem of err with prefix, as Istio's
// multierror.Prefix does.
func prefixed(err error, prefix string) error {
	if err == nil {
		return nil
	}
	list, ok := err.(*Error)
	if !ok {
		return fmt.Errorf("%s %w", prefix, err)
	}
	var out errs
	for _, e := range list.errs {
		out.add(fmt.Errorf("%s %w", prefix, e))
	}
	return out.err()
}
