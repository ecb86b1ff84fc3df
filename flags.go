package main

import "time"

// durationFlag is a flag.Value for a time.Duration that accepts "0".
type durationFlag struct{ time.Duration }

func (d *durationFlag) String() string { return d.Duration.String() }

func (d *durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}
