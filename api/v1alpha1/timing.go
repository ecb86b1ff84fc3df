package v1alpha1

import (
	"fmt"
	"time"
)

// MaxDerivedCheckTimeout caps the derived health-check timeout: a probe that
// has not answered in 15s is reported as Timeout rather than waited for.
const MaxDerivedCheckTimeout = 15 * time.Second

// DefaultCheckInterval is the manager's default --provider-check-interval.
const DefaultCheckInterval = 30 * time.Second

// EffectiveCheckTimeout returns timeout, or min(15s, interval) when timeout is
// zero. The webhook, the manager flags and the KVMHost controller all use it.
func EffectiveCheckTimeout(interval, timeout time.Duration) time.Duration {
	if timeout > 0 {
		return timeout
	}
	return min(MaxDerivedCheckTimeout, interval)
}

// ValidateCheckTiming enforces the one rule on check timing: a check must end
// before the next one is due. An interval alone (timeout 0) is always valid.
func ValidateCheckTiming(interval, timeout time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("check interval must be positive, got %s", interval)
	}
	if timeout < 0 {
		return fmt.Errorf("check timeout must not be negative, got %s", timeout)
	}
	if timeout > interval {
		return fmt.Errorf("check timeout %s must not exceed check interval %s", timeout, interval)
	}
	return nil
}
