(* Input generation (a weighted random DNA string) and the 2-bit nucleotide code. *)

let generate n =
  let seed = ref 7 in
  let next () =
    seed := ((!seed * 1103515245) + 12345) land 0x3fffffff;
    !seed lsr 10
  in
  (* Weights out of 1 lsl 20; a low-order second-order bias makes pairs uneven. *)
  let pick prev r =
    let r = if prev = 'G' then r lxor 0x5555 else r in
    if r < 317_000 then 'A' else if r < 525_000 then 'C' else if r < 730_000 then 'G' else 'T'
  in
  let b = Bytes.create n in
  let prev = ref 'A' in
  let planted = "GGTATTTTAATTTATAGT" in
  let i = ref 0 in
  while !i < n do
    let r = next () in
    if r land 0x3fff = 0 && !i + String.length planted <= n then begin
      (* plant the longest pattern now and then *)
      Bytes.blit_string planted 0 b !i (String.length planted);
      i := !i + String.length planted;
      prev := 'T'
    end else begin
      let c = pick !prev (r land 0xfffff) in
      Bytes.unsafe_set b !i c;
      prev := c;
      incr i
    end
  done;
  Bytes.unsafe_to_string b

let code = function 'A' -> 0 | 'C' -> 1 | 'G' -> 2 | 'T' -> 3 | c -> invalid_arg (String.make 1 c)
let letter k = "ACGT".[k land 3]

let encode s = String.fold_left (fun acc c -> (acc lsl 2) lor code c) 0 s

let decode k key = String.init k (fun i -> letter (key lsr (2 * (k - 1 - i))))
