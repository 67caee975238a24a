// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package tokenize

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
)

// The corpus the estimator is measured against (testdata/corpus.jsonl): prompts of
// seven kinds, generated from a fixed seed by genCorpus. TestCorpusIsGenerated keeps
// the checked-in file equal to the generator's output; -update-corpus rewrites it.

var updateCorpus = flag.Bool("update-corpus", false, "rewrite testdata/corpus.jsonl from genCorpus")

const corpusFile = "testdata/corpus.jsonl"

// Categories of the corpus, in the order the docs' table lists them.
var categories = []string{"english", "code", "json", "cjk", "numbers", "whitespace", "emoji"}

// perCategory is the number of prompts of each category.
const perCategory = 50

type sample struct {
	Category string `json:"category"`
	Prompt   string `json:"prompt"`
}

var words = strings.Fields(`the of and to in is was that for it with as his on be at by had are but from
or have an they which one you were all her she there would their we him been has when who will no more
if out so said what up its about than into them can only other time new some could these two may first
then do any like my now over such our man me even most made after also did many off before must well
back through years much where your way down should because each just those people how too little state
good very make world still see own men work long here get both between life being under never day same
another know while last might us great old year come since against go came right used take three
himself few house use during without again place around however home small found thought went say part
once high general upon school every does got united left number course war until always away something
fact water though less public put think almost hand enough far took head yet government system better
set told nothing night end why called eyes find going look asked later knew point next program city
business give group toward young days let room president side social given present several order national
possible rather second face per among form important often things looking early white case john become
large big need four within felt along children saw best church ever least power development light thing
seemed family interest want members mind country area others done although open god service problem
certain kind different thus began door help means sense whole matter perhaps itself york times law human
line above name example action company hands local show whether five history gave today either act feet
across taken past quite anything seen having death week experience body word half really field am car
words already themselves information tell college shall money period held keep sure real probably free
seems political cannot behind miss question air office making brought whose special heard major problems
ago became federal moment study available known result street economic boy position reason change south
board individual job society areas west close turn love community true court force full seem am wife`)

var idents = strings.Fields(`user count total items result value index buffer config handler request response
client server err ctx name data key node tree list map cache store token budget window limit offset size
parse render encode decode fetch update delete insert query filter sort merge split join build load save`)

// cjkChars are common characters of Chinese, Japanese kana and Korean hangul, as
// running text in those languages uses them.
const cjkChars = `的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从知` +
	`あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテトナニヌネノ` +
	`가나다라마바사아자차카타파하고는이에서를을의도한다있습니다그리고것수없`

const cjkPunct = "，。！？、「」：；（）"

var emojis = []string{"😀", "😂", "🥲", "😍", "🤔", "👍", "👍🏽", "🙏", "🔥", "✨", "🎉", "❤️", "🚀", "🦜", "🍕",
	"👨‍👩‍👧", "👩🏻‍💻", "🏳️‍🌈", "🇫🇷", "🇯🇵", "☕", "⚠️", "✅", "🧪", "📦"}

// genCorpus builds the corpus from a fixed seed.
func genCorpus() []sample {
	r := rand.New(rand.NewPCG(18, 2026))
	gens := map[string]func(*rand.Rand) string{
		"english": genEnglish, "code": genCode, "json": genJSON, "cjk": genCJK,
		"numbers": genNumbers, "whitespace": genWhitespace, "emoji": genEmoji,
	}
	var out []sample
	for _, c := range categories {
		for range perCategory {
			out = append(out, sample{Category: c, Prompt: gens[c](r)})
		}
	}
	return out
}

func pick[T any](r *rand.Rand, s []T) T { return s[r.IntN(len(s))] }

func sentence(r *rand.Rand) string {
	n := 4 + r.IntN(20)
	ws := make([]string, n)
	for i := range ws {
		ws[i] = pick(r, words)
		if i > 0 && r.IntN(12) == 0 {
			ws[i] += ","
		}
	}
	ws[0] = strings.ToUpper(ws[0][:1]) + ws[0][1:]
	return strings.Join(ws, " ") + pick(r, []string{".", ".", ".", "?", "!"})
}

func genEnglish(r *rand.Rand) string {
	var b strings.Builder
	for n := 1 + r.IntN(40); n > 0; n-- {
		b.WriteString(sentence(r))
		if r.IntN(6) == 0 {
			b.WriteString("\n\n")
		} else {
			b.WriteString(" ")
		}
	}
	return strings.TrimSpace(b.String())
}

func ident(r *rand.Rand) string {
	a, c := pick(r, idents), pick(r, idents)
	switch r.IntN(3) {
	case 0:
		return a
	case 1:
		return a + strings.ToUpper(c[:1]) + c[1:]
	}
	return a + "_" + c
}

func genCode(r *rand.Rand) string {
	var b strings.Builder
	for n := 1 + r.IntN(6); n > 0; n-- {
		f, x, y := ident(r), ident(r), ident(r)
		switch r.IntN(3) {
		case 0:
			fmt.Fprintf(&b, "func %s(%s []byte, %s int) (int, error) {\n\tif len(%s) < %s {\n\t\treturn 0, fmt.Errorf(\"%s: short %%d\", %s)\n\t}\n\tfor i := range %s {\n\t\t%s += int(%s[i])\n\t}\n\treturn %s, nil\n}\n\n",
				f, x, y, x, y, f, y, x, y, x, y)
		case 1:
			fmt.Fprintf(&b, "def %s(%s, %s=None):\n    \"\"\"%s\"\"\"\n    if %s is None:\n        %s = {}\n    for k, v in %s.items():\n        %s[k] = v * %d\n    return %s\n\n",
				f, x, y, sentence(r), y, y, x, y, r.IntN(100), y)
		default:
			fmt.Fprintf(&b, "export async function %s(%s) {\n  const %s = await fetch(`/api/%s/${%s.id}`);\n  if (!%s.ok) throw new Error('%s failed: ' + %s.status);\n  return (await %s.json()).%s ?? [];\n}\n\n",
				f, x, y, f, x, y, f, y, y, ident(r))
		}
	}
	return b.String()
}

func genJSON(r *rand.Rand) string {
	var v func(depth int) any
	v = func(depth int) any {
		switch k := r.IntN(6); {
		case k == 0 && depth < 3:
			m := map[string]any{}
			for n := 1 + r.IntN(6); n > 0; n-- {
				m[ident(r)] = v(depth + 1)
			}
			return m
		case k == 1 && depth < 3:
			a := make([]any, 1+r.IntN(5))
			for i := range a {
				a[i] = v(depth + 1)
			}
			return a
		case k == 2:
			return r.IntN(100000)
		case k == 3:
			return r.Float64() * 1000
		case k == 4:
			return r.IntN(2) == 0
		}
		return sentence(r)
	}
	m := map[string]any{}
	for n := 2 + r.IntN(8); n > 0; n-- {
		m[ident(r)] = v(1)
	}
	var b []byte
	if r.IntN(2) == 0 {
		b, _ = json.MarshalIndent(m, "", "  ")
	} else {
		b, _ = json.Marshal(m)
	}
	return string(b)
}

func genCJK(r *rand.Rand) string {
	chars := []rune(cjkChars)
	punct := []rune(cjkPunct)
	var b strings.Builder
	for n := 10 + r.IntN(600); n > 0; n-- {
		if r.IntN(12) == 0 {
			b.WriteRune(pick(r, punct))
			continue
		}
		b.WriteRune(pick(r, chars))
	}
	return b.String()
}

func genNumbers(r *rand.Rand) string {
	var b strings.Builder
	sep := pick(r, []string{" ", ", ", "\t", "\n", " | "})
	for n := 5 + r.IntN(200); n > 0; n-- {
		switch r.IntN(4) {
		case 0:
			fmt.Fprintf(&b, "%d", r.IntN(10))
		case 1:
			fmt.Fprintf(&b, "%d", r.Int64N(1e12))
		case 2:
			fmt.Fprintf(&b, "%.*f", 1+r.IntN(6), r.Float64()*1e4)
		default:
			fmt.Fprintf(&b, "%d", r.IntN(1000))
		}
		b.WriteString(sep)
	}
	return b.String()
}

func genWhitespace(r *rand.Rand) string {
	var b strings.Builder
	for n := 1 + r.IntN(12); n > 0; n-- {
		b.WriteString(strings.Repeat(pick(r, []string{" ", "\t", "\n", "  \n", "\r\n"}), 1+r.IntN(400)))
		b.WriteString(sentence(r))
	}
	return b.String()
}

func genEmoji(r *rand.Rand) string {
	var b strings.Builder
	for n := 1 + r.IntN(30); n > 0; n-- {
		if r.IntN(3) == 0 {
			b.WriteString(sentence(r))
			b.WriteByte(' ')
		}
		for k := 1 + r.IntN(4); k > 0; k-- {
			b.WriteString(pick(r, emojis))
		}
		b.WriteByte(' ')
	}
	return b.String()
}

func encodeCorpus(s []sample) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	for _, x := range s {
		_ = enc.Encode(x)
	}
	return buf.Bytes()
}

func readCorpus(t testing.TB) []sample {
	t.Helper()
	f, err := os.Open(corpusFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []sample
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var x sample
		if err := json.Unmarshal(sc.Bytes(), &x); err != nil {
			t.Fatal(err)
		}
		out = append(out, x)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestCorpusIsGenerated(t *testing.T) {
	want := encodeCorpus(genCorpus())
	if *updateCorpus {
		if err := os.WriteFile(corpusFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(corpusFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not genCorpus's output: run go test ./proxy/tokenize -run TestCorpusIsGenerated -args -update-corpus", corpusFile)
	}
	if n := len(readCorpus(t)); n != len(categories)*perCategory {
		t.Fatalf("corpus has %d prompts, want %d", n, len(categories)*perCategory)
	}
}
