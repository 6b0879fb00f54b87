(* The IUB complement table and in-place reverse complement of a byte range. *)

(* U first: its complement is A, but A's is T. *)
let pairs = [ ('U', 'A'); ('A', 'T'); ('C', 'G'); ('M', 'K'); ('R', 'Y'); ('W', 'W'); ('S', 'S');
              ('V', 'B'); ('H', 'D'); ('N', 'N') ]

let table =
  let t = Bytes.init 256 Char.chr in
  let set a b = Bytes.set t (Char.code a) b in
  List.iter
    (fun (a, b) ->
      set a b; set b a;
      set (Char.lowercase_ascii a) b;
      set (Char.lowercase_ascii b) a)
    pairs;
  t

let comp c = Bytes.unsafe_get table (Char.code c)

let reverse_complement b lo hi =
  let rec swap i j =
    if i < j then begin
      let ci = Bytes.unsafe_get b i and cj = Bytes.unsafe_get b j in
      Bytes.unsafe_set b i (comp cj);
      Bytes.unsafe_set b j (comp ci);
      swap (i + 1) (j - 1)
    end else if i = j then Bytes.unsafe_set b i (comp (Bytes.unsafe_get b i))
  in
  swap lo (hi - 1)
