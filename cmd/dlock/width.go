package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"unicode"
)

// What a line takes on a terminal: ls's table lines up its columns by it,
// and what dlock redraws in place (ls --watch, the waiting line) is cut to
// the terminal's size by it, as a line that wraps or a frame that scrolls
// cannot be redrawn.

// wide holds the characters a terminal draws two cells wide: East Asian
// wide and fullwidth characters (CJK ideographs, kana, Hangul, fullwidth
// forms) and the emoji drawn as pictures.
var wide = &unicode.RangeTable{
	R16: []unicode.Range16{
		{0x1100, 0x115f, 1}, {0x231a, 0x231b, 1}, {0x2329, 0x232a, 1}, {0x23e9, 0x23ec, 1},
		{0x23f0, 0x23f3, 3}, {0x25fd, 0x25fe, 1}, {0x2614, 0x2615, 1}, {0x2648, 0x2653, 1},
		{0x267f, 0x2693, 20}, {0x26a1, 0x26a1, 1}, {0x26aa, 0x26ab, 1}, {0x26bd, 0x26be, 1},
		{0x26c4, 0x26c5, 1}, {0x26ce, 0x26d4, 6}, {0x26ea, 0x26ea, 1}, {0x26f2, 0x26f3, 1},
		{0x26f5, 0x26fa, 5}, {0x26fd, 0x26fd, 1}, {0x2705, 0x2705, 1}, {0x270a, 0x270b, 1},
		{0x2728, 0x2728, 1}, {0x274c, 0x274e, 2}, {0x2753, 0x2755, 1}, {0x2757, 0x2757, 1},
		{0x2795, 0x2797, 1}, {0x27b0, 0x27bf, 15}, {0x2b1b, 0x2b1c, 1}, {0x2b50, 0x2b55, 5},
		{0x2e80, 0x303e, 1}, {0x3041, 0x33ff, 1}, {0x3400, 0x4dbf, 1}, {0x4e00, 0x9fff, 1},
		{0xa000, 0xa4cf, 1}, {0xa960, 0xa97f, 1}, {0xac00, 0xd7a3, 1}, {0xf900, 0xfaff, 1},
		{0xfe10, 0xfe19, 1}, {0xfe30, 0xfe6f, 1}, {0xff00, 0xff60, 1}, {0xffe0, 0xffe6, 1},
	},
	R32: []unicode.Range32{
		{0x16fe0, 0x16fe4, 1}, {0x17000, 0x18cff, 1}, {0x1b000, 0x1b2ff, 1}, {0x1f004, 0x1f004, 1},
		{0x1f0cf, 0x1f0cf, 1}, {0x1f18e, 0x1f18e, 1}, {0x1f191, 0x1f19a, 1}, {0x1f200, 0x1f251, 1},
		{0x1f300, 0x1f64f, 1}, {0x1f680, 0x1f6ff, 1}, {0x1f7e0, 0x1f7eb, 1}, {0x1f90c, 0x1f9ff, 1},
		{0x1fa70, 0x1faff, 1}, {0x20000, 0x2fffd, 1}, {0x30000, 0x3fffd, 1},
	},
}

// runeWidth returns the cells a terminal gives r: none for a combining mark
// or a format character (a zero-width joiner, say), two for a wide
// character, else one.
func runeWidth(r rune) int {
	switch {
	case unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf):
		return 0
	case unicode.Is(wide, r):
		return 2
	}
	return 1
}

// displayWidth returns the cells s takes on a terminal.
func displayWidth(s string) int {
	n := 0
	for _, r := range s {
		n += runeWidth(r)
	}
	return n
}

// cutWidth returns s cut to at most width cells, ending in "…" when cut.
func cutWidth(s string, width int) string {
	if displayWidth(s) <= width {
		return s
	}
	used := 0
	for i, r := range s {
		if used+runeWidth(r) > width-1 { // room for the "…"
			return s[:i] + "…"
		}
		used += runeWidth(r)
	}
	return s
}

// columns lays rows of cells out as lines, each column as wide as its
// widest cell and two spaces from the next; the last cell of a line is not
// padded. A cell wider than maxColumn (a name of a kilobyte) does not widen
// its column: it is written whole, two spaces before the rest of its line,
// which lines up no more, so that one such name does not pad every line to
// its width (wrapping them all on a terminal, where ls --watch would cut
// every line before its kind and holder).
func columns(rows [][]string) []string {
	var widths []int
	for _, row := range rows {
		for i, cell := range row[:max(len(row)-1, 0)] {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			if w := displayWidth(cell); w <= maxColumn {
				widths[i] = max(widths[i], w)
			}
		}
	}
	lines := make([]string, len(rows))
	for j, row := range rows {
		var b strings.Builder
		for i, cell := range row {
			b.WriteString(cell)
			if i < len(row)-1 {
				b.WriteString(strings.Repeat(" ", max(widths[i]-displayWidth(cell), 0)+2))
			}
		}
		lines[j] = b.String()
	}
	return lines
}

// maxColumn is the widest cell that widens its column in columns.
const maxColumn = 80

// fitWidth returns line cut to the width of the terminal out writes to, if
// it is one, so that it never wraps: a wrapped line could not be redrawn in
// place.
func fitWidth(out io.Writer, line string) string {
	if f, ok := out.(*os.File); ok {
		if cols, _ := termSize(f); cols > 1 {
			return cutWidth(line, cols-1)
		}
	}
	return line
}

// fitFrame returns lines, each cut to the width of the terminal out writes
// to, if it is one, and no more of them than leaves the terminal's last
// line for the cursor: a frame that scrolled could not be redrawn in place.
// The last line then says how many were left out.
func fitFrame(out io.Writer, lines []string) []string {
	f, ok := out.(*os.File)
	if !ok {
		return lines
	}
	if _, rows := termSize(f); rows >= 2 && len(lines) > rows-1 {
		left := len(lines) - (rows - 2) // two at least
		lines = append(lines[:rows-2:rows-2], fmt.Sprintf("… %d more lines (a taller terminal or a narrower pattern shows them)", left))
	}
	fitted := make([]string, len(lines))
	for i, l := range lines {
		fitted[i] = fitWidth(out, l)
	}
	return fitted
}
