package svgchart

import (
	"math"
	"strconv"
)

// Tick is a labelled value on an axis.
type Tick struct {
	Value float64
	Label string
}

// scale maps data values in [min, max] to pixels in [from, to], on a
// logarithmic axis when log is set (then min > 0).
type scale struct {
	min, max, from, to float64
	log                bool
}

func (s scale) at(v float64) float64 {
	lo, hi := s.min, s.max
	if s.log {
		v, lo, hi = math.Log10(v), math.Log10(lo), math.Log10(hi)
	}
	return s.from + (v-lo)/(hi-lo)*(s.to-s.from)
}

// domain widens [lo, hi] so that it has a length: a single value gets room
// around it (a factor of 2 on a logarithmic axis, 1 on a linear one).
func domain(lo, hi float64, log bool) (float64, float64) {
	if lo < hi {
		return lo, hi
	}
	if log {
		return lo / 2, hi * 2
	}
	return lo - 1, hi + 1
}

// niceStep is a round step (1, 2 or 5 times a power of ten) that cuts span
// into about n parts.
func niceStep(span float64, n int) float64 {
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	switch f := raw / mag; {
	case f <= 1:
		return mag
	case f <= 2:
		return 2 * mag
	case f <= 5:
		return 5 * mag
	default:
		return 10 * mag
	}
}

// valueAxis is a linear axis from zero (or from the lowest value when one is
// negative) to a round number at or above the highest value, with its ticks.
func valueAxis(lo, hi float64) (min, max float64, ticks []Tick) {
	lo, hi = math.Min(lo, 0), math.Max(hi, 0)
	if lo == hi {
		hi = 1
	}
	step := niceStep(hi-lo, 5)
	min, max = math.Floor(lo/step)*step, math.Ceil(hi/step)*step
	label := tickFormat(step, math.Max(-min, max))
	for i := 0; ; i++ {
		v := min + float64(i)*step
		if v > max+step/2 {
			break
		}
		ticks = append(ticks, Tick{Value: v, Label: label(v)})
	}
	return min, max, ticks
}

// autoTicks are round ticks inside [min, max]: powers of ten on a
// logarithmic axis, steps of niceStep on a linear one.
func autoTicks(min, max float64, log bool) []Tick {
	var ticks []Tick
	if log {
		for e := math.Ceil(math.Log10(min)); e <= math.Floor(math.Log10(max)); e++ {
			v := math.Pow(10, e)
			ticks = append(ticks, Tick{Value: v, Label: Value(v)})
		}
		return ticks
	}
	step := niceStep(max-min, 5)
	label := tickFormat(step, math.Max(math.Abs(min), math.Abs(max)))
	for v := math.Ceil(min/step) * step; v <= max+step/1e9; v += step {
		ticks = append(ticks, Tick{Value: v, Label: label(v)})
	}
	return ticks
}

// tickFormat returns how the ticks of an axis are written, every tick
// alike: in millions (M) or thousands (k) when the largest, top, is that
// big, and with as many decimals as the step needs in that unit; zero
// is "0".
func tickFormat(step, top float64) func(float64) string {
	unit, suffix := 1.0, ""
	switch {
	case top >= 1e6:
		unit, suffix = 1e6, "M"
	case top >= 1e4:
		unit, suffix = 1e3, "k"
	}
	decimals := 0
	if s := step / unit; s < 1 {
		decimals = int(math.Ceil(-math.Log10(s) - 1e-9))
	}
	return func(v float64) string {
		if math.Abs(v) < step/1e6 {
			return "0" // and no "-0" from a rounding error
		}
		return strconv.FormatFloat(v/unit, 'f', decimals, 64) + suffix
	}
}
