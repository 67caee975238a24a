// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package estimate

import "unicode/utf8"

// How a string's text is counted, in the same pass that finds its end (scan.go).
// docs/estimation.md gives the rules and their figures against o200k_base and
// cl100k_base.
//
// The generous count (T) charges, in twelfths of a token (genUnit):
//   - an ASCII letter, space, tab or newline a quarter token, punctuation a third: JSON and
//     code pack their quotes, braces and colons into short tokens;
//   - a digit a third of a token, and every run of digits two tokens more: the
//     encodings split numbers into groups of at most three digits, and the space or
//     sign before a number is a token of its own;
//   - a character of two or three bytes a token, one of four bytes (emoji, rare CJK)
//     three tokens, a byte that is not valid UTF-8 a token.
//
// The lower bound holds against any text, for both encodings. Each of these is a
// token the text cannot do without, and none is counted twice:
//   - a word start: an ASCII letter after an ASCII character that is not a letter or
//     an apostrophe, or at the start of the string. The encodings cut text into
//     pieces before merging (a word with at most one character before it, a group of
//     up to three digits, a run of punctuation, a run of spaces), a piece is at least
//     one token, and two word starts never share a piece;
//   - every three ASCII digits, rounded up: no token holds more than three digits, or
//     digits and anything else;
//   - the characters of other scripts, at the least share of a token one of them can
//     be (lowerWide: a token of o200k_base or cl100k_base holds at most sixteen
//     Cyrillic letters, ten CJK ideographs, one character of four bytes...). As a
//     token with a word start may also hold such characters, the bound is the larger
//     of the two counts, not their sum.
//
// Spaces and punctuation count nothing in the lower bound: both encodings merge a run
// of hundreds of spaces, or of a hundred dashes, into one token.
//
// Escapes (\n, \u00e9) count as the bytes they are written with in the generous count,
// which is never less than what they decode to, and nothing in the lower bound.

const (
	// genUnit is the generous count's unit: a twelfth of a token.
	genUnit = 12
	// lowerUnit is the unit of lowerWide: 1/560 of a token (560 is the least common
	// multiple of the most characters of each class a token holds).
	lowerUnit = 560
	// digitRunUnits is what a run of digits costs beyond its digits.
	digitRunUnits = 2 * genUnit
)

// Classes of ASCII bytes.
const (
	cPunct = iota
	cLetter
	cDigit
	cSpace
	cApostrophe
	cQuote
	cBackslash
	cControl
)

// genASCII is the generous count of one ASCII byte of each class, in genUnit.
var genASCII = [...]int64{
	cPunct: 4, cLetter: 3, cDigit: 4, cSpace: 3, cApostrophe: 4, cQuote: 4, cBackslash: 4, cControl: 3,
}

// asciiClass is the class of each ASCII byte.
var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := range t {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			t[c] = cLetter
		case c >= '0' && c <= '9':
			t[c] = cDigit
		case c == ' ':
			t[c] = cSpace
		case c == '\'':
			t[c] = cApostrophe
		case c == '"':
			t[c] = cQuote
		case c == '\\':
			t[c] = cBackslash
		case c < 0x20: // tabs and newlines too: a JSON string cannot hold them raw
			t[c] = cControl
		default:
			t[c] = cPunct
		}
	}
	return t
}()

// genWide is the generous count of a valid character of each UTF-8 length, in genUnit.
var genWide = [8]int64{2: genUnit, 3: genUnit + genUnit/4, 4: 3 * genUnit}

// genInvalid is the generous count of a byte that is not valid UTF-8 (it decodes to
// U+FFFD), in genUnit.
const genInvalid = genUnit

// lowerWide is the least share of a token a valid character of other scripts is,
// by its first byte, in lowerUnit: 1/n when no token of either encoding holds more
// than n characters whose first bytes share its row below (and none mixes rows past a
// whole token: TestLowerWideHoldsOnVocabularies checks every token).
var lowerWide = func() (t [256]int64) {
	for b := 0xC2; b <= 0xF4; b++ {
		switch {
		case b <= 0xDF: // Latin, Greek, Cyrillic, Hebrew, Arabic...: 16 a token
			t[b] = lowerUnit / 16
		case b == 0xE0: // Indic scripts, Thai: 20
			t[b] = lowerUnit / 20
		case b == 0xE1: // Georgian, Khmer, Hangul jamo...: 14
			t[b] = lowerUnit / 14
		case b == 0xE2 || b == 0xE3: // punctuation, symbols, kana, CJK punctuation: 16
			t[b] = lowerUnit / 16
		case b <= 0xE9: // CJK ideographs: 10
			t[b] = lowerUnit / 10
		case b <= 0xED: // Hangul syllables: 7
			t[b] = lowerUnit / 7
		case b <= 0xEF: // private use, compatibility and full-width forms: 8
			t[b] = lowerUnit / 8
		default: // four bytes (emoji, rare CJK): a token holds at most one
			t[b] = lowerUnit
		}
	}
	return t
}()

// The walk of a string reads each ASCII byte with one lookup in pairTable, by the
// byte and the category of the character before it, and adds the entry to a packed
// count: the generous units, the digit and the word start it adds. Other bytes (the
// quote, a backslash, controls, bytes of other scripts) leave the fast loop.
const (
	// Categories of the character before, as offsets into pairTable.
	catWord  = 0   // a letter, an apostrophe, a character of another script: no word starts after it
	catBreak = 256 // any other ASCII character
	catDigit = 512 // a digit (a break too)
	pairMask = 1023

	// The packed count: units in bits 0-22, digits in 23-41, word starts in 42-60;
	// a block of at most blockBytes bytes cannot overflow a field.
	digitShift = 23
	wordShift  = 42
	fieldMask  = 1<<19 - 1
	blockBytes = 1 << 18
	// special marks a byte the fast loop does not count.
	special = 1 << 63
)

// pairTable is the packed count of an ASCII byte after a character of each category;
// special for the bytes the fast loop leaves.
var pairTable = func() (t [pairMask + 1]uint64) {
	for i := range t {
		t[i] = special
	}
	for _, prev := range []int{catWord, catBreak, catDigit} {
		for c := range utf8.RuneSelf {
			cl := asciiClass[c]
			switch cl {
			case cQuote, cBackslash, cControl:
				continue
			}
			e := uint64(genASCII[cl])
			switch {
			case cl == cDigit:
				e |= 1 << digitShift
				if prev != catDigit {
					e += digitRunUnits
				}
			case cl == cLetter && prev != catWord:
				e |= 1 << wordShift
			}
			t[prev+c] = e
		}
	}
	return t
}()

// nextCat is the category of each ASCII byte as the character before the next.
var nextCat = func() (t [256]uint) {
	for c := range utf8.RuneSelf {
		switch asciiClass[c] {
		case cLetter, cApostrophe:
			t[c] = catWord
		case cDigit:
			t[c] = catDigit
		default:
			t[c] = catBreak
		}
	}
	return t
}()

// unpack adds a block's packed count to units, digits and words.
func unpack(acc uint64, units, digits, words *int64) {
	*units += int64(acc & (1<<digitShift - 1))
	*digits += int64(acc >> digitShift & fieldMask)
	*words += int64(acc >> wordShift & fieldMask)
}

// totals is a string's generous count and lower bound; the generous count is never
// below the lower bound.
func totals(units, digits, words, wide int64) (gen, lower int64) {
	lower = (digits+2)/3 + max(words, wide/lowerUnit)
	return max((units+genUnit-1)/genUnit, lower), lower
}

// textCounts is the generous count and the lower bound of a string's text taken as
// written (no escapes: the JSON text of tools, an object key).
func textCounts(b []byte) (gen, lower int64) {
	var units, digits, words, wide int64
	var acc uint64
	pc := uint(catBreak)
	blockEnd := min(len(b), blockBytes)
	for i := 0; ; {
		if i >= blockEnd {
			unpack(acc, &units, &digits, &words)
			if i >= len(b) {
				return totals(units, digits, words, wide)
			}
			acc, blockEnd = 0, min(len(b), i+blockBytes)
		}
		c := b[i]
		if e := pairTable[(pc+uint(c))&pairMask]; e&special == 0 {
			acc += e
			pc = nextCat[c]
			i++
			continue
		}
		if c < utf8.RuneSelf {
			// A quote, a backslash or a control, taken as written: a break.
			units += genASCII[asciiClass[c]]
			pc = catBreak
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			units += genInvalid
		} else {
			units += genWide[size&7]
			wide += lowerWide[c]
		}
		i += size
		pc = catWord
	}
}
