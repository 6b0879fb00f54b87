(* Matrix products over three rings (floats, integers mod 2^32, min-plus) in four loop
   orders; prints one checksum per ring and whether the orders agree. *)

let run (type e) name (module R : Ring.S with type t = e) n seed =
  let module M = Matmul.Make (R) in
  let st = ref seed in
  let rnd () = st := ((!st * 1664525) + 1013904223) land 0xffffffff; !st lsr 8 in
  let x = M.init n (fun _ _ -> R.of_int (rnd ())) and y = M.init n (fun _ _ -> R.of_int (rnd ())) in
  let orders = [ M.ijk; M.ikj; M.kij; (fun a b -> M.blocked a b) ] in
  let results = List.map (fun f -> f x y) orders in
  let first = List.hd results in
  let agree = List.for_all (M.equal first) results in
  (* a second product, chained, so the result feeds back in *)
  let z = M.blocked ~tile:48 first x in
  Printf.printf "%-8s n %d orders agree %b checksum %08x chained %08x\n" name n agree (M.checksum first)
    (M.checksum z)

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 64 in
  run "float" (module Ring.Float_ring) n 1;
  run "word32" (module Ring.Word_ring) n 2;
  run "minplus" (module Ring.Tropical) n 3
