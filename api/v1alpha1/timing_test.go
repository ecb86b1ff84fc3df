package v1alpha1

import (
	"testing"
	"time"
)

func TestCheckTiming(t *testing.T) {
	cases := []struct {
		interval, timeout time.Duration
		wantEffective     time.Duration
		wantErr           bool
	}{
		{12 * time.Second, 0, 12 * time.Second, false},
		{time.Minute, 0, 15 * time.Second, false},
		{time.Minute, 30 * time.Second, 30 * time.Second, false},
		{10 * time.Second, 10 * time.Second, 10 * time.Second, false},
		{10 * time.Second, 11 * time.Second, 11 * time.Second, true},
		{0, 0, 0, true},
		{time.Second, -time.Second, -time.Second, true},
	}
	for _, tc := range cases {
		got := EffectiveCheckTimeout(tc.interval, tc.timeout)
		if tc.timeout >= 0 && got != tc.wantEffective {
			t.Errorf("EffectiveCheckTimeout(%s, %s) = %s, want %s", tc.interval, tc.timeout, got, tc.wantEffective)
		}
		if err := ValidateCheckTiming(tc.interval, tc.timeout); (err != nil) != tc.wantErr {
			t.Errorf("ValidateCheckTiming(%s, %s) = %v, wantErr %v", tc.interval, tc.timeout, err, tc.wantErr)
		}
	}
}
