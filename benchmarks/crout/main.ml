(* Crout LU over floats (diagonally dominant random systems) and over integers modulo a
   prime (exact solves of random systems). *)

module FC = Crout.Make (Field.Float_field)
module P = Field.Mod_prime (struct let p = 1_000_003 end)
module PC = Crout.Make (P)

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 50 in
  let reps = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let st = ref 42 in
  let rnd () = st := ((!st * 1103515245) + 12345) land 0x3fffffff; !st lsr 6 in
  let frnd () = (float_of_int (rnd () land 0xffff) /. 65536.) -. 0.5 in
  let ferr = ref 0. and fsum = ref 0. and exact = ref 0 and singular = ref 0 and psum = ref 0 in
  for _ = 1 to reps do
    let a = Array.init n (fun i -> Array.init n (fun j -> frnd () +. if i = j then float_of_int n /. 4. else 0.)) in
    let x0 = Array.init n (fun i -> float_of_int (i mod 5) -. 2.) in
    let lu = FC.factor a in
    let x = FC.solve lu (FC.mul_vec a x0) in
    Array.iteri (fun i xi -> ferr := Float.max !ferr (Float.abs (xi -. x0.(i)))) x;
    fsum := !fsum +. Array.fold_left ( +. ) 0. (FC.solve lu (Array.make n 1.));
    let ap = Array.init n (fun _ -> Array.init n (fun _ -> P.of_int (rnd ()))) in
    let xp0 = Array.init n (fun i -> P.of_int ((i * i) + 7)) in
    match PC.factor ap with
    | exception Crout.Singular _ -> incr singular
    | lup ->
        let xp = PC.solve lup (PC.mul_vec ap xp0) in
        if xp = xp0 then incr exact;
        psum := (!psum + Array.fold_left P.add 0 (PC.solve lup (Array.make n 1))) mod 1_000_003
  done;
  Printf.printf "n %d reps %d\n" n reps;
  Printf.printf "float: max error below 1e-10 %b, checksum %.6f\n" (!ferr < 1e-10) !fsum;
  Printf.printf "mod p: exact %d singular %d checksum %d\n" !exact !singular !psum
