(* A 1-bit-per-pixel bitmap, rows padded to whole bytes as in the PBM format. *)

type t = { width : int; height : int; row_bytes : int; bits : Bytes.t }

let create width height =
  let row_bytes = (width + 7) / 8 in
  { width; height; row_bytes; bits = Bytes.make (row_bytes * height) '\000' }

(* fills row [y] from [pixel x], packing 8 pixels per byte, most significant bit first *)
let fill_row b y pixel =
  let base = y * b.row_bytes in
  let acc = ref 0 and nbits = ref 0 and pos = ref base in
  let flush () =
    Bytes.unsafe_set b.bits !pos (Char.unsafe_chr (!acc lsl (8 - !nbits)));
    incr pos;
    acc := 0;
    nbits := 0
  in
  for x = 0 to b.width - 1 do
    acc := (!acc lsl 1) lor (if pixel x then 1 else 0);
    incr nbits;
    if !nbits = 8 then flush ()
  done;
  if !nbits > 0 then flush ()

let popcount_byte c =
  let rec go v n = if v = 0 then n else go (v land (v - 1)) (n + 1) in
  go (Char.code c) 0

let count_set b = Bytes.fold_left (fun n c -> n + popcount_byte c) 0 b.bits

(* FNV-1a style hash (63-bit) over the PBM header and the packed rows *)
let checksum b =
  let h = ref 0x0bf29ce484222325 in
  let feed c = h := (!h lxor Char.code c) * 0x100000001b3 in
  String.iter feed (Printf.sprintf "P4\n%d %d\n" b.width b.height);
  Bytes.iter feed b.bits;
  !h land 0xffffffffffff
