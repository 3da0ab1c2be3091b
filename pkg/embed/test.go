package embed

import (
	"context"
	"hash/fnv"
	"strings"
	"unicode"
)

// TestDimensions is the size of Test's vectors.
const TestDimensions = 64

// concepts is Test's table: the words of one line mean the same, and
// map to one dimension. Words not in it hash into the dimensions after
// the concepts', with a smaller weight, so unrelated texts still differ.
var concepts = [][]string{
	{"car", "cars", "automobile", "automobiles", "vehicle", "vehicles", "sedan"},
	{"dog", "dogs", "puppy", "puppies", "canine", "hound"},
	{"cat", "cats", "kitten", "kittens", "feline"},
	{"favorite", "favourite", "prefer", "prefers", "preferred", "preference", "likes", "like", "love", "loves", "fond"},
	{"color", "colour", "colors", "colours", "hue", "shade"},
	{"blue", "azure", "navy", "cobalt"},
	{"red", "crimson", "scarlet"},
	{"birthday", "born", "birth", "birthdate"},
	{"coffee", "espresso", "latte", "cappuccino"},
	{"tea", "chai"},
	{"city", "town", "hometown"},
	{"live", "lives", "living", "reside", "resides", "residence", "home"},
	{"job", "work", "works", "occupation", "profession", "employed", "career"},
	{"name", "called", "named"},
	{"meeting", "appointment", "meet"},
	{"allergy", "allergic", "allergies", "intolerant"},
	{"peanut", "peanuts", "groundnut"},
	{"food", "meal", "eat", "eats", "dish", "cuisine"},
	{"drink", "drinks", "beverage"},
	{"paris", "france", "french"},
	{"deadline", "due", "cutoff"},
	{"project", "initiative"},
	{"password", "passphrase", "credential"},
	{"server", "host", "machine"},
}

// stopWords carry no meaning for Test.
var stopWords = map[string]bool{
	"a": true, "an": true, "the": true, "is": true, "are": true, "was": true, "my": true, "your": true, "of": true,
	"to": true, "in": true, "on": true, "and": true, "or": true, "what": true, "which": true, "i": true, "me": true,
	"do": true, "does": true, "did": true, "for": true, "with": true, "it": true, "that": true, "this": true, "user": true,
	"user's": true, "s": true, "at": true, "by": true, "be": true, "has": true, "have": true, "who": true, "where": true,
}

var conceptOf = func() map[string]int {
	m := map[string]int{}
	for i, words := range concepts {
		for _, w := range words {
			m[w] = i
		}
	}
	return m
}()

// Test is a deterministic embedder for tests: a text's vector is the
// normalized sum of its words' vectors, a word of the concept table
// giving weight 1 to its concept's dimension and any other word (not a
// stop word) weight 0.5 to a dimension chosen by its hash. So "my car is
// blue" and "the automobile is azure" are identical, and texts sharing
// no concept or word are orthogonal or nearly. A text of stop words only
// gets the hash of the whole text, so no vector is zero.
type Test struct{}

// Name implements Embedder.
func (Test) Name() string { return ProviderTest }

// Embed implements Embedder.
func (Test) Embed(ctx context.Context, texts []string, _ Purpose) ([][]float32, error) {
	if err := checkTexts(texts); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([][]float32, len(texts))
	for i, t := range texts {
		out[i] = TestVector(t)
	}
	return out, nil
}

// TestVector is Test's vector of text.
func TestVector(text string) []float32 {
	v := make([]float32, TestDimensions)
	words := strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '\''
	})
	meaningful := false
	for _, w := range words {
		w = strings.Trim(w, "'")
		if w == "" || stopWords[w] {
			continue
		}
		meaningful = true
		if c, ok := conceptOf[w]; ok {
			v[c]++
			continue
		}
		v[hashDim(w)] += 0.5
	}
	if !meaningful {
		v[hashDim(text)] = 1
	}
	return Normalize(v)
}

func hashDim(w string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(w))
	free := TestDimensions - len(concepts)
	return len(concepts) + int(h.Sum32()%uint32(free))
}
