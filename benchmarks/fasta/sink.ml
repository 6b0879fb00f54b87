(* Consumers of output lines.  Instead of printing the sequences, the program feeds each
   line to a sink that hashes it or counts its letters; sinks combine with [Tee]. *)

module type S = sig
  type t
  val create : unit -> t
  val line : t -> Bytes.t -> int -> unit  (* buffer, used length *)
  val report : t -> string
end

module Fnv : S = struct
  type t = { mutable h : int; mutable lines : int }
  let prime = 0x100000001b3
  let create () = { h = 0xcbf29ce48422; lines = 0 }
  let mix h c = (h lxor Char.code c) * prime land 0xffffffffffff
  let line t b len =
    let h = ref t.h in
    for i = 0 to len - 1 do h := mix !h (Bytes.unsafe_get b i) done;
    t.h <- mix !h '\n';
    t.lines <- t.lines + 1
  let report t = Printf.sprintf "lines %d fnv %012x" t.lines t.h
end

module Counts : S = struct
  type t = int array
  let create () = Array.make 256 0
  let line t b len =
    for i = 0 to len - 1 do
      let k = Char.code (Bytes.unsafe_get b i) in
      Array.unsafe_set t k (Array.unsafe_get t k + 1)
    done
  let report t =
    let buf = Buffer.create 64 in
    let others = ref 0 in
    Array.iteri
      (fun k n ->
        if n > 0 then
          match Char.chr k with
          | 'a' | 'c' | 'g' | 't' | 'A' | 'C' | 'G' | 'T' ->
              Printf.bprintf buf "%c:%d " (Char.chr k) n
          | _ -> others := !others + n)
      t;
    Printf.bprintf buf "other:%d" !others;
    Buffer.contents buf
end

module Tee (A : S) (B : S) : S = struct
  type t = A.t * B.t
  let create () = (A.create (), B.create ())
  let line (a, b) buf len = A.line a buf len; B.line b buf len
  let report (a, b) = A.report a ^ "\n  " ^ B.report b
end
