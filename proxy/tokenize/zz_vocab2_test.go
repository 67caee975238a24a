package tokenize

import (
	"fmt"
	"testing"

	"github.com/tiktoken-go/tokenizer/codec"
)

func grp(c byte) int {
	switch {
	case c >= 0xC2 && c <= 0xDF:
		return 0
	case c >= 0xE0 && c <= 0xE3:
		return 1 + int(c-0xE0)
	case c >= 0xE4 && c <= 0xE9:
		return 5
	case c >= 0xEA && c <= 0xED:
		return 6
	case c >= 0xEE && c <= 0xEF:
		return 7
	case c >= 0xF0 && c <= 0xF4:
		return 8
	}
	return -1
}

func TestVocab2(t *testing.T) {
	for _, c := range []*codec.Codec{codec.NewO200kBase(), codec.NewCl100kBase()} {
		var mx [9]int
		var ex [9]string
		var toks []string
		for i := uint(0); i < 210000; i++ {
			s, err := c.Decode([]uint{i})
			if err == nil {
				toks = append(toks, s)
			}
		}
		for _, s := range toks {
			var n [9]int
			for i := 0; i < len(s); i++ {
				if g := grp(s[i]); g >= 0 {
					n[g]++
				}
			}
			for g := range n {
				if n[g] > mx[g] {
					mx[g], ex[g] = n[g], s
				}
			}
		}
		fmt.Println(c.GetName(), mx)
		for g := range ex { fmt.Printf("  %d %q\n", g, ex[g]) }
	}
}
