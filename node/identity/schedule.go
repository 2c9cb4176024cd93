package identity

import "time"

// renewalAt is when a certificate valid from notBefore to notAfter is
// renewed, seen at now: at half-life, minus up to a tenth of the lifetime
// (jitter(n) returns a value in [0, n)) so a node's identities do not all
// renew at once; never before now. A lifetime that is empty, negative or
// already over yields now: such a certificate is renewed at once rather
// than trusted, whatever its dates say.
func renewalAt(notBefore, notAfter, now time.Time, jitter func(n int64) int64) time.Time {
	life := notAfter.Sub(notBefore)
	if life <= 0 || !notAfter.After(now) {
		return now
	}
	at := notBefore.Add(life / 2)
	if spread := int64(life / 10); spread > 0 {
		at = at.Add(-time.Duration(jitter(spread)))
	}
	if at.Before(now) {
		return now
	}
	return at
}

// nextRetry doubles the backoff after a failed or unusable issuance,
// between lo and hi.
func nextRetry(cur, lo, hi time.Duration) time.Duration {
	if cur == 0 {
		return lo
	}
	return min(2*cur, hi)
}
