package dashboard

import (
	"encoding/json"
	"fmt"
	"html"
	"html/template"
	"math"
	"strings"
)

// plot draws a task name's last hour as an inline SVG: completions per
// minute as bars (failures stacked in red) and p50/p95 runtime as lines on
// their own scale. Only numbers computed here and the escaped name go into
// it, which is why it may be marked safe HTML.
func plot(name string, ps []Point) template.HTML {
	const w, h, left, right, top, bottom = 600.0, 160.0, 44.0, 56.0, 10.0, 20.0
	pw, ph := w-left-right, h-top-bottom
	maxCount, maxRT := 1, 0.0
	for _, p := range ps {
		maxCount = max(maxCount, p.Succeeded+p.Failed)
		maxRT = max(maxRT, p.P95)
	}
	if maxRT <= 0 {
		maxRT = 1
	}
	n := float64(max(len(ps), 1))
	bw := pw / n
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %g %g" width="%g" height="%g" role="img" aria-label="%s">`,
		w, h, w, h, html.EscapeString("throughput and runtime of "+name))
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" class="frame"/>`, left, top, pw, ph)
	for i, p := range ps {
		x := left + float64(i)*bw
		sh := ph * float64(p.Succeeded) / float64(maxCount)
		fh := ph * float64(p.Failed) / float64(maxCount)
		if sh > 0 {
			fmt.Fprintf(&b, `<rect class="ok" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d succeeded</title></rect>`,
				x, top+ph-sh, math.Max(bw-1, 1), sh, p.Time.Format("15:04"), p.Succeeded)
		}
		if fh > 0 {
			fmt.Fprintf(&b, `<rect class="fail" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d failed</title></rect>`,
				x, top+ph-sh-fh, math.Max(bw-1, 1), fh, p.Time.Format("15:04"), p.Failed)
		}
	}
	line := func(class string, val func(Point) float64) {
		var pts []string
		for i, p := range ps {
			if p.Samples == 0 {
				continue
			}
			x := left + (float64(i)+0.5)*bw
			y := top + ph - ph*val(p)/maxRT
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
			fmt.Fprintf(&b, `<circle class="%s" cx="%.1f" cy="%.1f" r="2.5"><title>%s %s: %s</title></circle>`,
				class, x, y, p.Time.Format("15:04"), class, html.EscapeString(fmtSecs(val(p))))
		}
		if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline class="%s" points="%s"/>`, class, strings.Join(pts, " "))
		}
	}
	line("p50", func(p Point) float64 { return p.P50 })
	line("p95", func(p Point) float64 { return p.P95 })
	fmt.Fprintf(&b, `<text x="%g" y="%g" class="axis" text-anchor="end">%d/min</text>`, left-4, top+8, maxCount)
	fmt.Fprintf(&b, `<text x="%g" y="%g" class="axis" text-anchor="end">0</text>`, left-4, top+ph)
	fmt.Fprintf(&b, `<text x="%g" y="%g" class="axis">%s</text>`, w-right+4, top+8, html.EscapeString(fmtSecs(maxRT)))
	if len(ps) > 0 {
		fmt.Fprintf(&b, `<text x="%g" y="%g" class="axis">%s</text>`, left, h-4, ps[0].Time.Format("15:04"))
		fmt.Fprintf(&b, `<text x="%g" y="%g" class="axis" text-anchor="end">%s UTC</text>`, left+pw, h-4, ps[len(ps)-1].Time.Format("15:04"))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func fmtSecs(f float64) string {
	switch {
	case f >= 1:
		return fmt.Sprintf("%.2fs", f)
	case f >= 0.001:
		return fmt.Sprintf("%.1fms", f*1000)
	}
	return fmt.Sprintf("%.0fµs", f*1e6)
}

func indentJSON(v any) string {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
